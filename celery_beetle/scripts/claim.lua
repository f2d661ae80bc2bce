-- claim.lua: grant the lease on a message to one worker, or say why not.
-- The same rules as celery_beetle.outcome.decide_claim, in one atomic step.
--
-- KEYS[1]  the message's record, beetle:{<queue>:<message_id>}
-- ARGV[1]  now_ms             the caller's clock (never Redis TIME, so tests need no sleep)
-- ARGV[2]  expires_at_ms      the message's expiry (x-beetle-expires-at)
-- ARGV[3]  lease_timeout_ms
-- ARGV[4]  attempts_limit     the most times the body may start
-- ARGV[5]  owner              who claims (host:pid), at most 48 bytes
-- ARGV[6]  ttl_margin_ms      kept past the message's expiry, lease and retry time
--
-- Returns one of
--   {'acquired', token, attempt, lease_deadline_ms}
--   {'done', status}                       status 'c' completed or 'f' failed
--   {'locked', lease_deadline_ms, owner}   another owner's lease is live
--   {'delayed', retry_not_before_ms}
--   {'exhausted', attempts}                the record is now failed
--   {'expired'}

local key = KEYS[1]
local now = tonumber(ARGV[1])
local expires_at = tonumber(ARGV[2])
local lease_timeout = tonumber(ARGV[3])
local attempts_limit = tonumber(ARGV[4])
local owner = ARGV[5]
local margin = tonumber(ARGV[6])

if expires_at <= now then
  return {'expired'}
end

local fields = redis.call('HMGET', key, 's', 'a', 'l', 'n', 'o', 't', 'x')
local status = fields[1]
local attempts = tonumber(fields[2]) or 0
local lease = tonumber(fields[3]) or 0
local not_before = tonumber(fields[4]) or 0
local token = tonumber(fields[6]) or 0
local stored_expiry = tonumber(fields[7]) or 0

if status == 'c' or status == 'f' then
  return {'done', status}
end
if status == 'r' and lease > now then
  return {'locked', lease, fields[5] or ''}
end
if status == 'p' and not_before > now then
  return {'delayed', not_before}
end
if status and attempts >= attempts_limit then
  redis.call('HSET', key, 's', 'f')
  redis.call('HDEL', key, 'l', 'n', 'o')
  redis.call('PEXPIRE', key, math.max(stored_expiry - now, 0) + margin)
  return {'exhausted', attempts}
end

local deadline = now + lease_timeout
redis.call('HSET', key, 's', 'r', 'a', attempts + 1, 'l', deadline, 'o', owner,
  't', token + 1, 'x', expires_at)
redis.call('HDEL', key, 'n')
redis.call('PEXPIRE', key, math.max(expires_at, deadline) - now + margin)
return {'acquired', token + 1, attempts + 1, deadline}
