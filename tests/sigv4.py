"""A small, independent SigV4 signer for raw requests (query protocol,
skewed clocks), checked against the gateway's verifier."""

import datetime
import hashlib
import hmac
import urllib.parse

import requests


def _hmac(key, text):
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signed_post(url, body, access_key, secret, region="ru-msk-1", headers=None, when=None):
    """POSTs `body` (bytes) to `url`, signed for service sqs at time `when`."""
    when = when or datetime.datetime.now(datetime.timezone.utc)
    amz_date = when.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    parts = urllib.parse.urlsplit(url)
    headers = dict(headers or {})
    headers.update({"host": parts.netloc, "x-amz-date": amz_date})
    signed = sorted(h.lower() for h in headers)
    lower = {k.lower(): v for k, v in headers.items()}
    canonical = "\n".join([
        "POST",
        urllib.parse.quote(parts.path or "/", safe="/~"),
        "",
        "".join(f"{h}:{lower[h].strip()}\n" for h in signed),
        ";".join(signed),
        hashlib.sha256(body).hexdigest(),
    ])
    scope = f"{day}/{region}/sqs/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{secret}".encode(), day), region), "sqs"), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={';'.join(signed)}, Signature={signature}"
    )
    del headers["host"]
    return requests.post(url, data=body, headers=headers, timeout=30)
