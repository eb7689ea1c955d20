-- KEYS: the writer's key, the readers' set, the write counter, the holder
-- records' hash, the waiters' sorted set (members 'ARRIVAL:ID', a waiting
-- reader's ID starting with 'r', scored by their marks' expiry). ARGV: the
-- readers' key prefix, owner, ttl ms, access ('r', 'w' or 'u'), holder
-- record, arrival (zero-padded ms, by the client's clock), waiter id (''
-- for an attempt that does not wait), a waiter's mark in ms.
-- Readers' keys share the name's hash tag, so they live in KEYS' slot.
-- A waiter that is not granted marks itself (until now + mark). A writer
-- is granted when nobody holds and no reader that arrived before it waits
-- (readers that queued before it keep their place); readers who arrive
-- after a waiting writer queue behind it. A reader is granted when no
-- writer holds and no writer that arrived at or before it waits, and no
-- upgradeable reader upgrades or has
-- upgraded (the hash's fields 'upgrading' and 'upgraded' name it; its
-- reader key is then the writer's lease). An upgradeable reader ('u') is a
-- reader granted only when no other is (field 'upgrader'), which it
-- becomes. Returns {1, token} when granted (a
-- writer's: the counter, raised; a reader's: the counter as it is), else
-- {0, ms until the blocking holder's lease ends, -1 if unknown}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
local arrival = tonumber(ARGV[6])
-- Whether a live mark of a waiting reader (readers) or writer that
-- arrived before this acquisition (a writer's: at or before) is there.
local function waits_before(readers)
  for _, mark in ipairs(redis.call('ZRANGE', KEYS[5], 0, -1)) do
    local since, r = string.match(mark, '^(%d+):(r?)')
    since = tonumber(since)
    if since and (r == 'r') == readers then
      if since < arrival or (not readers and since == arrival) then
        return true
      end
    end
  end
  return false
end
-- Refused: a waiter marks itself, or renews its mark.
local function refused(left)
  if ARGV[7] ~= '' then
    redis.call('ZADD', KEYS[5], now + tonumber(ARGV[8]), ARGV[6] .. ':' .. ARGV[7])
  end
  return {0, left}
end
local writer_left = redis.call('PTTL', KEYS[1])
if ARGV[4] == 'w' then
  local left = writer_left
  if left == -2 then
    left = -1
    for _, owner in ipairs(redis.call('SMEMBERS', KEYS[2])) do
      local l = redis.call('PTTL', ARGV[1] .. owner)
      if l == -2 then
        redis.call('SREM', KEYS[2], owner)
        redis.call('HDEL', KEYS[4], owner)
      elseif left < 0 or (l >= 0 and l < left) then
        left = l
      end
    end
    if redis.call('SCARD', KEYS[2]) == 0 and not waits_before(true) then
      if ARGV[7] ~= '' then
        redis.call('ZREM', KEYS[5], ARGV[6] .. ':' .. ARGV[7])
      end
      redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
      redis.call('HSET', KEYS[4], 'writer', ARGV[5])
      return {1, redis.call('INCR', KEYS[3])}
    end
  end
  return refused(left)
end
if writer_left ~= -2 then
  return refused(writer_left)
end
local up = redis.call('HMGET', KEYS[4], 'upgrader', 'upgrading', 'upgraded')
if up[1] then
  local left = redis.call('PTTL', ARGV[1] .. up[1])
  if left == -2 then
    redis.call('HDEL', KEYS[4], 'upgrader', 'upgrading', 'upgraded')
  elseif up[2] or up[3] or ARGV[4] == 'u' then
    return refused(left)
  end
end
if waits_before(false) then
  return refused(-1)
end
if ARGV[7] ~= '' then
  redis.call('ZREM', KEYS[5], ARGV[6] .. ':' .. ARGV[7])
end
redis.call('SET', ARGV[1] .. ARGV[2], ARGV[2], 'PX', ARGV[3])
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[2], ARGV[5])
if ARGV[4] == 'u' then
  redis.call('HSET', KEYS[4], 'upgrader', ARGV[2])
end
return {1, tonumber(redis.call('GET', KEYS[3]) or '0')}
