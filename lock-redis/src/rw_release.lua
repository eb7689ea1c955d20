-- KEYS: the grant's key (the writer's or the reader's), the readers' set,
-- the holder records' hash. ARGV: owner, its field in the hash ('writer'
-- or the owner), the lock's channel, the wake-up message. Frees the grant
-- if `owner` still holds it (an upgradeable reader's mark with it) and
-- tells the waiters. Returns 1 if it was
-- ours, else 0.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[2])
if redis.call('HGET', KEYS[3], 'upgrader') == ARGV[1] then
  redis.call('HDEL', KEYS[3], 'upgrader', 'upgrading', 'upgraded')
end
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
