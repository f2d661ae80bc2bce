-- release.lua: the owner hands the message back before its body started.
-- The same rules as celery_beetle.store.outcome.decide_release, in one atomic step: the record
-- becomes pending, due at once, and the attempt a start counted is taken back (a
-- reservation, field v, counted none).
--
-- KEYS[1]  the message's record (KEYS[2]: its old key; record.lua, prepended, sets `key`)
-- ARGV[1]  token              the fencing token the claim returned; 0: release by owner
-- ARGV[2]  now_ms
-- ARGV[3]  ttl_margin_ms
-- ARGV[4]  owner              with token 0: the owner of a claim whose reply never came
--
-- Returns {'ok'}, or {'not_owner', status, token} as complete.lua does.

local token = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local margin = tonumber(ARGV[3])
local owner = ARGV[4] or ''

local fields = redis.call('HMGET', key, 's', 'a', 't', 'x', 'o', 'v')
local stored_token = tonumber(fields[3]) or 0
local by_owner = token == 0 and owner ~= '' and fields[1] == 'r' and fields[5] == owner
if not by_owner and (fields[1] ~= 'r' or stored_token ~= token) then
  return {'not_owner', fields[1] or '', stored_token}
end

local attempts = tonumber(fields[2]) or 0
if not fields[6] then
  attempts = math.max(attempts - 1, 0)
end
redis.call('HSET', key, 's', 'p', 'a', attempts)
redis.call('HDEL', key, 'l', 'n', 'o', 'v', 'i')
redis.call('PEXPIRE', key, math.max((tonumber(fields[4]) or 0) - now, 0) + margin)
return {'ok'}
