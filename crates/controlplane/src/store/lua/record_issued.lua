-- Records the snapshot issued to a live session, fenced by ownership epoch.
-- KEYS: issued, session, epoch
-- ARGV: session_id, version, epoch, checksum_hex, nonce, ttl_ms
local epoch = tonumber(redis.call('GET', KEYS[3]) or '0')
if epoch < 1 then
  epoch = 1
  redis.call('SET', KEYS[3], epoch)
end
if tonumber(ARGV[3]) ~= epoch then
  return {'STALE_EPOCH', epoch}
end
if redis.call('HGET', KEYS[2], 'sid') ~= ARGV[1] then
  return {'STALE_SESSION', 0}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'sid', ARGV[1], 'v', ARGV[2], 'e', ARGV[3], 'c', ARGV[4], 'n', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return {'OK', epoch}
