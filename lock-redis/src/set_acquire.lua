local n = #KEYS / 4
for i = 0, n - 1 do
  local k = i * 4
  if redis.call('EXISTS', KEYS[k + 1], KEYS[k + 3]) > 0 then
    return {0}
  end
end
local granted = {1}
for i = 0, n - 1 do
  local k = i * 4
  redis.call('SET', KEYS[k + 1], ARGV[1], 'PX', ARGV[2])
  redis.call('SET', KEYS[k + 4], ARGV[3])
  redis.call('PUBLISH', KEYS[k + 1] .. ':changed', 'granted')
  granted[i + 2] = redis.call('INCR', KEYS[k + 2])
end
return granted
