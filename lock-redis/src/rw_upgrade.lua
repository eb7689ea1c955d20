-- KEYS: the writer's key, the readers' set, the write counter, the holder
-- records' hash. ARGV: the readers' key prefix, owner, mode ('up' or
-- 'give up'), the lock's channel, the wake-up message.
-- 'up': the upgradeable reader `owner` (the hash's 'upgrader') becomes the
-- writer once no other reader's key is live: field 'upgraded' names it, the
-- counter is raised, and its reader key stays its lease. Until then field
-- 'upgrading' names it, which keeps new readers out. Returns {1, token}
-- when upgraded (again for a run sent twice), {0, ms until the first other
-- reader's lease ends} while others read, {-1} if `owner` is not the live
-- upgradeable reader.
-- 'give up': an upgrade that will not wait longer lets readers in again
-- (and tells the waiters); returns {0}.
local key = ARGV[1] .. ARGV[2]
if redis.call('HGET', KEYS[4], 'upgrader') ~= ARGV[2] or redis.call('PTTL', key) == -2 then
  return {-1}
end
if redis.call('HGET', KEYS[4], 'upgraded') == ARGV[2] then
  return {1, tonumber(redis.call('GET', KEYS[3]) or '0')}
end
if ARGV[3] ~= 'up' then
  if redis.call('HDEL', KEYS[4], 'upgrading') == 1 then
    redis.call('PUBLISH', ARGV[4], ARGV[5])
  end
  return {0}
end
local others, first = false, -1
for _, owner in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if owner ~= ARGV[2] then
    local l = redis.call('PTTL', ARGV[1] .. owner)
    if l == -2 then
      redis.call('SREM', KEYS[2], owner)
      redis.call('HDEL', KEYS[4], owner)
    else
      others = true
      if first < 0 or (l >= 0 and l < first) then
        first = l
      end
    end
  end
end
if others or redis.call('PTTL', KEYS[1]) ~= -2 then
  redis.call('HSET', KEYS[4], 'upgrading', ARGV[2])
  return {0, first}
end
redis.call('HDEL', KEYS[4], 'upgrading')
redis.call('HSET', KEYS[4], 'upgraded', ARGV[2])
return {1, redis.call('INCR', KEYS[3])}
