-- KEYS: a lock's queue. The waiters whose entries are live: renewed
-- within their own TTL (the key QUEUE:ID lives).
local n = 0
for _, waiter in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if redis.call('EXISTS', KEYS[1] .. ':' .. waiter) == 1 then
    n = n + 1
  end
end
return n
