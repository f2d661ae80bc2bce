-- mark_inbox.lua: the running body writes its effects through the inbox.
-- The same rules as celery_beetle.store.outcome.decide_mark_inbox, in one atomic step: a run cut
-- short after this may be followed by another past the attempts limit (claim.lua's
-- inbox_extra_starts), which finds the inbox row and returns.
--
-- KEYS[1]  the message's record (KEYS[2]: its old key; record.lua, prepended, sets `key`)
-- ARGV[1]  token              the fencing token of the running body
--
-- Returns {'ok'}, or {'not_owner', status, token} as complete.lua does.

local token = tonumber(ARGV[1])
local fields = redis.call('HMGET', key, 's', 't')
local stored_token = tonumber(fields[2]) or 0
if fields[1] ~= 'r' or stored_token ~= token then
  return {'not_owner', fields[1] or '', stored_token}
end
redis.call('HSET', key, 'i', 1)
return {'ok'}
