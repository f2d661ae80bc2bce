-- start.lua: the body begins on the gate's reservation: count the attempt, start the lease.
-- The same rules as celery_beetle.store.outcome.decide_start, in one atomic step. Only the holder
-- of the reservation's token may start; a reservation another copy took over after it ran
-- out is not ours any more, and the delivery goes back to the gate.
--
-- KEYS[1]  the message's record (KEYS[2]: its old key; record.lua, prepended, sets `key`)
-- ARGV[1]  token              the fencing token of the gate's claim
-- ARGV[2]  now_ms
-- ARGV[3]  lease_timeout_ms
-- ARGV[4]  ttl_margin_ms
--
-- Returns {'ok', lease_deadline_ms, attempt} (also for a start already counted under this
-- token: a retry after a lost reply gets the same answer), or {'not_owner', status, token}
-- as complete.lua does.

local token = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local deadline = now + tonumber(ARGV[3])
local margin = tonumber(ARGV[4])

local fields = redis.call('HMGET', key, 's', 't', 'x', 'v', 'a', 'l')
local stored_token = tonumber(fields[2]) or 0
if fields[1] ~= 'r' or stored_token ~= token then
  return {'not_owner', fields[1] or '', stored_token}
end
local attempts = tonumber(fields[5]) or 0
if not fields[4] then
  return {'ok', tonumber(fields[6]) or 0, attempts}
end

redis.call('HSET', key, 'a', attempts + 1, 'l', deadline)
redis.call('HDEL', key, 'v')
redis.call('PEXPIRE', key, math.max(tonumber(fields[3]) or 0, deadline) - now + margin)
return {'ok', deadline, attempts + 1}
