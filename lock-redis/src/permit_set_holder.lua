-- KEYS: a permit's slot key, the name's permits' hash. ARGV: owner, the
-- slot's holder field, record. Writes the record only if `owner` holds the
-- slot. Returns 1 if it did, else 0.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return 1
