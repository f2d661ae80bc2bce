-- record.lua: which key holds the message's record; prepended to every other script.
--
-- KEYS[1]  the record's key (celery_beetle.store.keys.record_key)
-- KEYS[2]  optional: its key in the previous version (celery_beetle.store.keys.legacy_key), passed
--          for one release and only where the key changed form. A worker of the previous
--          version writes only there, so while KEYS[1] holds no record and KEYS[2] does, the
--          record is the one under KEYS[2], and the script reads and writes it there.
--
-- Defines `key`, the key the script works on.

local key = KEYS[1]
if KEYS[2] and redis.call('HEXISTS', key, 's') == 0
    and redis.call('HEXISTS', KEYS[2], 's') == 1 then
  key = KEYS[2]
end

