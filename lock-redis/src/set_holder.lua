if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('PUBLISH', KEYS[1] .. ':changed', 'value')
return 1
