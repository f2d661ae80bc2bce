-- reject.lua: mark bad input (an unknown task, an undecodable body) failed without a run.
-- The same rules as celery_beetle.outcome.decide_reject, in one atomic step: the first copy
-- to ask is the one dead-lettered; every later copy finds the record final and is acked.
--
-- KEYS[1]  the message's record, beetle:{<queue>:<message_id>}
-- ARGV[1]  now_ms
-- ARGV[2]  expires_at_ms      the message's expiry (x-beetle-expires-at)
-- ARGV[3]  ttl_margin_ms
--
-- Returns {'first'} (now failed: dead-letter this copy), or {'done', status} if the record
-- was completed or failed already (ack this copy, nothing else).

local key = KEYS[1]
local now = tonumber(ARGV[1])
local expires_at = tonumber(ARGV[2])
local margin = tonumber(ARGV[3])

local status = redis.call('HGET', key, 's')
if status == 'c' or status == 'f' then
  return {'done', status}
end

redis.call('HSET', key, 's', 'f', 'x', expires_at)
redis.call('HDEL', key, 'l', 'n', 'o')
redis.call('PEXPIRE', key, math.max(expires_at - now, 0) + margin)
return {'first'}
