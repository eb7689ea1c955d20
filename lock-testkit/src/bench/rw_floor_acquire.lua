-- The hand-written Redis reader-writer lock of the benchmarks' floor, with
-- the guarantees of lock-redis's: a writer's key and a key per reader, each
-- with its lease; a write counter; the waiting writers' marks (a sorted
-- set by expiry, members 'ARRIVAL:ID'), which keep later readers out.
-- KEYS: writer key, readers' set, write counter, waiting writers' marks.
-- ARGV: owner, ttl ms, 'r' or 'w', readers' key prefix, arrival (ms).
-- Returns {1, token} when granted, else {0}.
local t = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', tonumber(t[1]) * 1000)
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0}
end
if ARGV[3] == 'w' then
  for _, owner in ipairs(redis.call('SMEMBERS', KEYS[2])) do
    if redis.call('EXISTS', ARGV[4] .. owner) == 1 then
      return {0}
    end
    redis.call('SREM', KEYS[2], owner)
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, redis.call('INCR', KEYS[3])}
end
for _, mark in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  if tonumber(string.match(mark, '^(%d+):')) <= tonumber(ARGV[5]) then
    return {0}
  end
end
redis.call('SET', ARGV[4] .. ARGV[1], ARGV[1], 'PX', ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
return {1, tonumber(redis.call('GET', KEYS[3]) or '0')}
