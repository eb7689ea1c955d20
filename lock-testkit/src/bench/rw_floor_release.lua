-- The floor's release (see rw_floor_acquire.lua): compare-and-delete of
-- the grant's key, the reader out of the readers' set, a message to the
-- waiters. KEYS: the grant's key, the readers' set. ARGV: owner, channel.
-- Returns 1 if it was ours, else 0.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[2], '')
return 1
