-- dead_lettered.lua: a failed message's dead letter is stored; the record becomes final.
-- The same rules as celery_beetle.store.outcome.decide_dead_lettered, in one atomic step.
--
-- KEYS[1]  the message's record (KEYS[2]: its old key; record.lua, prepended, sets `key`)
-- ARGV[1]  now_ms
-- ARGV[2]  ttl_margin_ms
-- ARGV[3]  retention_ms: the record is kept this long at least, as its dead letter may wait
--          (celery_beetle.store.outcome.dead_lettered_ttl_ms)
--
-- Returns {'ok'} when a dead letter was owed, {'none'} otherwise (marked already, or gone).

local now = tonumber(ARGV[1])
local margin = tonumber(ARGV[2])
local retention = tonumber(ARGV[3]) or 0

local fields = redis.call('HMGET', key, 's', 'w', 'x')
if fields[1] ~= 'f' or not fields[2] then
  return {'none'}
end
redis.call('HDEL', key, 'w', 'l', 'n', 'o')
redis.call('PEXPIRE', key, math.max((tonumber(fields[3]) or 0) - now, retention, 0) + margin)
return {'ok'}
