-- extend.lua: move the owner's lease deadline to now + lease_timeout_ms.
-- The same rules as celery_beetle.store.outcome.decide_extend, in one atomic step.
--
-- KEYS[1]  the message's record (KEYS[2]: its old key; record.lua, prepended, sets `key`)
-- ARGV[1]  token              the fencing token the claim returned
-- ARGV[2]  now_ms
-- ARGV[3]  lease_timeout_ms
-- ARGV[4]  ttl_margin_ms
-- ARGV[5]  reservation        1: the gate renews a reservation (field v); once the body has
--                             begun the full lease stands, unchanged and not shortened
--
-- Returns {'ok', lease_deadline_ms}, or {'not_owner', status, token} as complete.lua does.

local token = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local deadline = now + tonumber(ARGV[3])
local margin = tonumber(ARGV[4])
local reservation = tonumber(ARGV[5]) or 0

local fields = redis.call('HMGET', key, 's', 't', 'x', 'v', 'l')
local stored_token = tonumber(fields[2]) or 0
if fields[1] ~= 'r' or stored_token ~= token then
  return {'not_owner', fields[1] or '', stored_token}
end
if reservation == 1 and not fields[4] then
  return {'ok', tonumber(fields[5]) or 0}
end

redis.call('HSET', key, 'l', deadline)
redis.call('PEXPIRE', key, math.max(tonumber(fields[3]) or 0, deadline) - now + margin)
return {'ok', deadline}
