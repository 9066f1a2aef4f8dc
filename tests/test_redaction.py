"""Credentials never reach text meant for people: repr, errors, CLI output."""

from __future__ import annotations

import pytest

from airlock_redis import RedisEffectStore
from airlock_redis.cli import main
from airlock_redis.redaction import redact

SECRET = "S3CRETvalue"


@pytest.mark.parametrize(
    "url",
    [
        f"redis://user:{SECRET}@127.0.0.1:1/0",
        f"redis://127.0.0.1:1/0?password={SECRET}",
        f"redis+sentinel://127.0.0.1:1,127.0.0.1:2/svc?sentinel_password={SECRET}",
        f"rediss://127.0.0.1:1/0?ssl_ca_certs=/x&auth_token={SECRET}",
    ],
)
def test_repr_of_a_store_hides_the_secret(url: str) -> None:
    shown = repr(RedisEffectStore(url))
    assert SECRET not in shown
    assert "***" in shown


def test_a_url_error_hides_the_secret() -> None:
    with pytest.raises(ValueError) as error:
        RedisEffectStore(f"redis+cluster://u:{SECRET}@127.0.0.1:1/0?bogus=1&password={SECRET}")
    assert SECRET not in str(error.value)
    assert "bogus" in str(error.value)


def test_doctor_output_hides_the_secret(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "--url", f"redis://127.0.0.1:1/0?password={SECRET}", "--timeout", "1"])
    out = capsys.readouterr()
    assert code == 2  # unreachable is unsafe
    assert SECRET not in out.out + out.err
    assert "password=***" in out.out


def test_redact_keeps_what_is_not_secret() -> None:
    text = "redis://host:6379/0?ssl_ca_certs=/etc/ca.pem&db=2"
    assert redact(text) == text
