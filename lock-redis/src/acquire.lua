local reserved = redis.call('GET', KEYS[4])
if (not reserved or reserved == ARGV[3])
    and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if reserved then redis.call('DEL', KEYS[4]) end
  if ARGV[3] ~= '' then
    redis.call('ZREM', KEYS[3], ARGV[3])
    redis.call('DEL', KEYS[3] .. ':' .. ARGV[3])
  end
  if KEYS[5] and ARGV[6] then redis.call('SET', KEYS[5], ARGV[6]) end
  redis.call('PUBLISH', KEYS[1] .. ':changed', 'granted')
  return {1, redis.call('INCR', KEYS[2])}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  -- This very attempt was granted already: the request was sent again (a
  -- cluster client resends one whose connection dropped before its reply).
  return {1, tonumber(redis.call('GET', KEYS[2]))}
end
if ARGV[3] ~= '' then
  local ticket = ARGV[5]
  if not ticket or ticket == '' then
    local now = redis.call('TIME')
    ticket = now[1] .. string.format('%06d', tonumber(now[2]))
  end
  redis.call('ZADD', KEYS[3], 'NX', ticket, ARGV[3])
  -- The entry counts while this key lives: the waiter's own short TTL,
  -- renewed by each of its attempts.
  redis.call('SET', KEYS[3] .. ':' .. ARGV[3], 1, 'PX', ARGV[4])
  if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[4]) then
    redis.call('PEXPIRE', KEYS[3], ARGV[4])
  end
end
local wait = redis.call('PTTL', KEYS[1])
if reserved and reserved ~= ARGV[3] then
  wait = math.max(wait, redis.call('PTTL', KEYS[4]))
end
return {0, wait}
