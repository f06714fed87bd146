"""The Raft message cipher that replaces pysyncobj's Fernet tokens."""

from __future__ import annotations

import pytest

from raftsched.raft_cipher import InvalidToken, RaftCipher, RaftSecrets

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


# -- rotation -----------------------------------------------------------------

OLD, NEW = "the-old-cluster-secret-0123", "the-new-cluster-secret-4567"
# The node configurations of a rolling rotation, in order (docs/security.md).
ROTATION = [
    RaftSecrets(OLD),
    RaftSecrets(OLD, accepted=(NEW,)),
    RaftSecrets(NEW, accepted=(OLD,)),
    RaftSecrets(NEW),
]


def talk(first: RaftSecrets, second: RaftSecrets) -> bool:
    """Whether two nodes so configured read each other's messages both ways."""
    a, b = RaftCipher(first), RaftCipher(second)
    try:
        return b.decrypt(a.encrypt_at_time(b"ping", 1)) == b"ping" and (
            a.decrypt(b.encrypt_at_time(b"pong", 1)) == b"pong"
        )
    except InvalidToken:
        return False


@pytest.mark.parametrize("step", range(len(ROTATION) - 1))
def test_during_each_rolling_step_restarted_and_waiting_nodes_talk(step: int) -> None:
    # While a step rolls through the cluster, some nodes run the step's
    # configuration and the rest the previous one: every pair must talk, so
    # any two running nodes of three make a quorum at every moment.
    before, after = ROTATION[step], ROTATION[step + 1]
    assert talk(before, before) and talk(before, after) and talk(after, after)


def test_a_two_step_rotation_would_split_the_cluster() -> None:
    # Why three steps: a node that sends with the new secret straight away is
    # unreadable to the nodes not yet restarted.
    assert not talk(RaftSecrets(OLD), RaftSecrets(NEW, accepted=(OLD,)))


def test_a_node_with_only_another_secret_is_refused_and_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stranger, member = (
        RaftCipher(RaftSecrets("a-wrong-secret-entirely-xyz")),
        RaftCipher(RaftSecrets(NEW, accepted=(OLD,))),
    )
    with caplog.at_level("WARNING", logger="raftsched.raft"):
        for _ in range(3):
            with pytest.raises(InvalidToken):
                member.decrypt(stranger.encrypt_at_time(b"join me", 5))
    assert [r.levelname for r in caplog.records] == ["WARNING"]  # once per sender
    assert "a-wrong-secret" not in caplog.text


def test_a_sender_keeps_the_secret_it_proved_and_secrets_never_print() -> None:
    old_sender = RaftCipher(RaftSecrets(OLD))
    receiver = RaftCipher(RaftSecrets(NEW, accepted=(OLD,)))
    for stamp in range(3):
        assert receiver.decrypt(old_sender.encrypt_at_time(b"entry", stamp)) == b"entry"
    assert OLD not in repr(ROTATION[1]) and NEW not in repr(ROTATION[1])
    assert RaftSecrets(NEW, accepted=(NEW, OLD, OLD)).known == (NEW, OLD)
