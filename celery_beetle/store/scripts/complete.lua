-- complete.lua: record that the body succeeded; only the current owner may.
-- The same rules as celery_beetle.store.outcome.decide_complete, in one atomic step.
--
-- KEYS[1]  the message's record (KEYS[2]: its old key; record.lua, prepended, sets `key`)
-- ARGV[1]  token           the fencing token the claim returned
-- ARGV[2]  now_ms
-- ARGV[3]  ttl_margin_ms
--
-- Returns {'ok'} (also when this token's completion is already recorded, so a lost reply
-- can be retried), or {'not_owner', status, token} with the stored status ('' if no record)
-- and token: the record is not running under this token (the lease was taken over).
-- A completed record keeps only s, a, e, t and x (and the replay fields): it stays until
-- the message expires.

local token = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local margin = tonumber(ARGV[3])

local fields = redis.call('HMGET', key, 's', 't', 'x')
local stored_token = tonumber(fields[2]) or 0
if fields[1] == 'c' and stored_token == token then
  return {'ok'}  -- already recorded: a retry after a lost reply
end
if fields[1] ~= 'r' or stored_token ~= token then
  return {'not_owner', fields[1] or '', stored_token}
end

redis.call('HSET', key, 's', 'c')
redis.call('HDEL', key, 'l', 'n', 'o', 'v', 'i')
redis.call('PEXPIRE', key, math.max((tonumber(fields[3]) or 0) - now, 0) + margin)
return {'ok'}
