-- KEYS: the writer's key, the readers' set, the write counter, the holder
-- records' hash, the waiters' sorted set. ARGV: the readers' key
-- prefix. Returns {counter, waiting writers (an upgrade under way among
-- them), then per live holder: 'w', 'r' or 'u' (an upgradeable reader; an
-- upgraded one is 'w'), ms left (-1: no TTL), record}, all as strings.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local up = redis.call('HMGET', KEYS[4], 'upgrader', 'upgrading', 'upgraded')
local waiting = 0
for _, mark in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. now, '+inf')) do
  if not string.match(mark, '^%d+:r') then
    waiting = waiting + 1
  end
end
if up[1] and up[2] == up[1] and redis.call('PTTL', ARGV[1] .. up[1]) ~= -2 then
  waiting = waiting + 1
end
local out = {
  redis.call('GET', KEYS[3]) or '0',
  tostring(waiting),
}
local left = redis.call('PTTL', KEYS[1])
if left ~= -2 then
  out[#out + 1] = 'w'
  out[#out + 1] = tostring(left)
  out[#out + 1] = redis.call('HGET', KEYS[4], 'writer') or ''
end
for _, owner in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local l = redis.call('PTTL', ARGV[1] .. owner)
  if l ~= -2 then
    if up[1] == owner and up[3] == owner then
      out[#out + 1] = 'w'
    elseif up[1] == owner then
      out[#out + 1] = 'u'
    else
      out[#out + 1] = 'r'
    end
    out[#out + 1] = tostring(l)
    out[#out + 1] = redis.call('HGET', KEYS[4], owner) or ''
  end
end
return out
