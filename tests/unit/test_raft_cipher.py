"""The Raft message cipher that replaces pysyncobj's Fernet tokens."""

from __future__ import annotations

import pytest

from raftsched.raft_cipher import InvalidToken, RaftCipher

SECRET = "a-cluster-secret-of-some-length"


def test_round_trip_between_processes_sharing_the_secret() -> None:
    sender, receiver = RaftCipher(SECRET), RaftCipher(SECRET)
    token = sender.encrypt_at_time(b"append_entries", 1234)
    assert receiver.extract_timestamp(token) == 1234
    assert receiver.decrypt(token) == b"append_entries"
    assert receiver.decrypt(sender.encrypt_at_time(b"", 1235)) == b""


def test_nonces_never_repeat_and_senders_use_their_own_keys() -> None:
    first, second = RaftCipher(SECRET), RaftCipher(SECRET)
    tokens = [first.encrypt_at_time(b"same", 7) for _ in range(3)]
    tokens.append(second.encrypt_at_time(b"same", 7))
    assert len(set(tokens)) == 4
    assert len({token[25:37] for token in tokens[:3]}) == 3  # nonces
    assert tokens[0][1:17] != tokens[3][1:17]  # sender salts


@pytest.mark.parametrize("change", ["secret", "body", "timestamp", "salt", "truncated", "version"])
def test_anything_altered_or_foreign_is_refused(change: str) -> None:
    sender, receiver = RaftCipher(SECRET), RaftCipher(SECRET)
    token = bytearray(sender.encrypt_at_time(b"vote for me", 99))
    if change == "secret":
        token = bytearray(RaftCipher("another-secret-entirely!").encrypt_at_time(b"x", 99))
    elif change == "body":
        token[-20] ^= 1
    elif change == "timestamp":
        token[24] ^= 1
    elif change == "salt":
        token[3] ^= 1
    elif change == "truncated":
        token = token[:40]
    else:
        token[0] = 2
    with pytest.raises(InvalidToken):
        receiver.decrypt(bytes(token))
    # A refused sender is not remembered; the genuine one still gets through.
    assert receiver.decrypt(sender.encrypt_at_time(b"ok", 100)) == b"ok"
