-- Applies a positive or negative ACK of the issued snapshot.
-- KEYS: session, runtime, issued
-- ARGV: session_id, version, epoch, checksum_hex, applied ('1'|'0'), nonce, session_ttl_ms
local s = redis.call('HMGET', KEYS[1], 'sid', 'acked_v', 'acked_e')
if s[1] ~= ARGV[1] then
  return {'STALE_SESSION', 0}
end
local i = redis.call('HMGET', KEYS[3], 'sid', 'v', 'e', 'c', 'n')
if i[1] ~= ARGV[1] or i[2] ~= ARGV[2] or i[3] ~= ARGV[3] or i[4] ~= ARGV[4]
    or (ARGV[6] ~= '' and i[5] ~= ARGV[6]) then
  return {'ACK_MISMATCH', 0}
end
local version, acked = tonumber(ARGV[2]), tonumber(s[2])
if ARGV[5] == '1' then
  if version < acked or (version == acked and ARGV[3] ~= s[3]) then
    return {'ACK_MISMATCH', 0}
  end
  if version > acked then
    redis.call('HSET', KEYS[1], 'acked_v', ARGV[2], 'acked_e', ARGV[3])
    redis.call('DEL', KEYS[2])
  end
else
  redis.call('HSET', KEYS[1], 'nacked_v', ARGV[2])
  redis.call('DEL', KEYS[2])
end
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return {'OK', 0}
