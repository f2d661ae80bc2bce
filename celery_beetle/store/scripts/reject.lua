-- reject.lua: fail bad input (an unknown task, an undecodable body) without a run.
-- The same rules as celery_beetle.store.outcome.decide_reject, in one atomic step: the first copy
-- to ask dead-letters the message (its dead letter is owed by that owner until
-- dead_lettered.lua); every later copy finds it settled and is acked.
--
-- KEYS[1]  the message's record (KEYS[2]: its old key; record.lua, prepended, sets `key`)
-- ARGV[1]  now_ms
-- ARGV[2]  expires_at_ms      the message's expiry (x-beetle-expires-at)
-- ARGV[3]  ttl_margin_ms
-- ARGV[4]  reason             why (x-beetle-dead-reason)
-- ARGV[5]  owner              who asks (the same owner asking again gets 'first' again)
-- ARGV[6]  dead_letter_lease_ms
--
-- Returns {'first'} (dead-letter this copy), {'done', status} (settled already: ack this
-- copy, nothing else), or {'wait', lease_deadline_ms}: another owner's lease is live (its
-- dead letter is being published, or it runs), so hand this copy back until then.

local now = tonumber(ARGV[1])
local expires_at = tonumber(ARGV[2])
local margin = tonumber(ARGV[3])
local reason = ARGV[4]
local owner = ARGV[5]
local dead_letter_lease = tonumber(ARGV[6])

local fields = redis.call('HMGET', key, 's', 'w', 'l', 'o')
local status = fields[1]
if status == 'c' or (status == 'f' and not fields[2]) then
  return {'done', status}
end
local lease = tonumber(fields[3]) or 0
if (status == 'r' or status == 'f') and lease > now and fields[4] ~= owner then
  return {'wait', lease}
end

local deadline = now + dead_letter_lease
redis.call('HSET', key, 's', 'f', 'x', expires_at, 'w', 1, 'r', reason, 'o', owner,
  'l', deadline)
redis.call('HDEL', key, 'n', 'v', 'i')
redis.call('PEXPIRE', key, math.max(expires_at, deadline) - now + margin)
return {'first'}
