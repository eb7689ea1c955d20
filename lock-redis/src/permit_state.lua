-- KEYS: the name's limit, its permits' hash. ARGV: the slot keys' common
-- prefix. Returns {limit, slot, ms left, token, record, slot, …}, all as
-- strings, over the live permits (ms left -1: no TTL), or {} when none is
-- live.
local base = ARGV[1]
local limit = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local out = {}
for s = 0, limit - 1 do
  local left = redis.call('PTTL', base .. s)
  if left ~= -2 then
    local info = redis.call('HMGET', KEYS[2], tostring(s), s .. ':holder')
    out[#out + 1] = tostring(s)
    out[#out + 1] = tostring(left)
    out[#out + 1] = info[1] or '0'
    out[#out + 1] = info[2] or ''
  end
end
if #out == 0 then
  return {}
end
table.insert(out, 1, tostring(limit))
return out
