"""A subscription's sink: where a relay publishes its events (docs/relays.md,
section 1). A subscription without one is a webhook (its `url` and `secret`).

A sink is a kind and its options, each option a name and a plain value
(string or integer), sorted by name: one shape for every broker, so that a
new kind is one more entry in `SINK_OPTIONS`, not a new command. Since
cluster version 10 (`SINK_VERSION`); the fields that carry it
(`CreateSubscription`'s and `CopySubscription`'s `sink`, `tenants`,
`key_field`) are encoded only when set.

The options may hold credentials (a broker URL's password): they are
replicated, as a webhook's secret is, so that any leader can connect, and
never shown (`redacted_url`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from raftsched.core.kernel.codec import CodecError
from raftsched.core.kernel.results import Rejected
from raftsched.core.kernel.validate import TOKEN_MAX, invalid

SINK_VERSION: Final = 10
"""The cluster version that added broker sinks, and a subscription's
`tenants` and `key_field`."""

NATS: Final = "nats"
RABBITMQ: Final = "rabbitmq"
REDIS: Final = "redis"
SINK_URL_CHARS_MAX: Final = 2_000
SINK_NAME_CHARS_MAX: Final = 256
TENANTS_MAX: Final = 50
KEY_FIELD_CHARS_MAX: Final = 128
# The placeholders a stream, subject or routing key may hold, filled per event.
PLACEHOLDERS: Final = ("{type}", "{tenant}", "{shard}")


@dataclass(frozen=True, slots=True)
class OptionRule:
    kind: type[Any]  # str or int
    required: bool
    # For a string: its longest; for an integer: its largest (smallest 1).
    most: int
    # For a string: the URL schemes it must start with (empty: any text).
    schemes: tuple[str, ...] = ()


# kind -> option name -> rule. A NATS `url` may list several servers of one
# cluster, comma-separated (`nats://a:4222,nats://b:4222`). A RabbitMQ sink
# without `exchange` publishes to the default exchange (the routing key names
# the queue).
SINK_OPTIONS: Final[dict[str, dict[str, OptionRule]]] = {
    NATS: {
        "url": OptionRule(str, True, SINK_URL_CHARS_MAX, ("nats://", "tls://")),
        "subject": OptionRule(str, True, SINK_NAME_CHARS_MAX),
    },
    RABBITMQ: {
        "url": OptionRule(str, True, SINK_URL_CHARS_MAX, ("amqp://", "amqps://")),
        "exchange": OptionRule(str, False, SINK_NAME_CHARS_MAX),
        "routing_key": OptionRule(str, True, SINK_NAME_CHARS_MAX),
    },
    REDIS: {
        "url": OptionRule(str, True, SINK_URL_CHARS_MAX, ("redis://", "rediss://")),
        "stream": OptionRule(str, True, SINK_NAME_CHARS_MAX),
        "maxlen": OptionRule(int, False, TOKEN_MAX),
    },
}
SINK_KINDS: Final = tuple(sorted(SINK_OPTIONS))
# The option that names where a kind's messages go (may hold PLACEHOLDERS).
DESTINATION_OPTION: Final = {NATS: "subject", RABBITMQ: "routing_key", REDIS: "stream"}


@dataclass(frozen=True, slots=True)
class Sink:
    kind: str
    options: tuple[tuple[str, str | int], ...]  # sorted by name

    def option(self, name: str) -> Any:
        return dict(self.options).get(name)

    @property
    def destination(self) -> str:
        """The stream, subject or routing key template."""
        return str(self.option(DESTINATION_OPTION[self.kind]))


def make_sink(kind: str, options: Mapping[str, str | int]) -> Sink:
    return Sink(kind, tuple(sorted(options.items())))


def check_sink(sink: object) -> Rejected | None:
    """A sink the core keeps: a known kind with its options, each checked."""
    if type(sink) is not Sink or type(sink.kind) is not str:
        return invalid("sink", "sink must be a sink")
    rules = SINK_OPTIONS.get(sink.kind)
    if rules is None:
        return invalid("sink", f"sink.kind must be one of {', '.join(SINK_KINDS)}")
    options = sink.options
    if type(options) is not tuple or not all(
        type(pair) is tuple and len(pair) == 2 and type(pair[0]) is str for pair in options
    ):
        return invalid("sink", "sink options must be (name, value) pairs")
    names = [name for name, _ in options]
    if names != sorted(set(names)):
        return invalid("sink", "sink options must be sorted and unique")
    given = dict(options)
    for name in names:
        if name not in rules:
            return invalid(f"sink.{name}", f"a {sink.kind} sink has no option {name}")
    for name, rule in rules.items():
        value = given.get(name)
        if value is None:
            if rule.required:
                return invalid(f"sink.{name}", f"a {sink.kind} sink needs {name}")
            continue
        rejected = _check_option(name, value, rule)
        if rejected is not None:
            return rejected
    return None


def _check_option(name: str, value: object, rule: OptionRule) -> Rejected | None:
    field = f"sink.{name}"
    if rule.kind is int:
        if type(value) is not int or not 1 <= value <= rule.most:
            return invalid(field, f"{field} must be an integer from 1 to {rule.most}")
        return None
    if type(value) is not str or not value.strip() or len(value) > rule.most:
        return invalid(field, f"{field} must be a non-empty string of at most {rule.most} chars")
    if rule.schemes and not value.startswith(rule.schemes):
        return invalid(field, f"{field} must start with {' or '.join(rule.schemes)}")
    return None


def check_tenants(tenants: object) -> Rejected | None:
    if tenants is None:
        return None
    if type(tenants) is not tuple or len(tenants) > TENANTS_MAX:
        return invalid("tenants", f"tenants must be at most {TENANTS_MAX} tenant names")
    for tenant in tenants:
        if type(tenant) is not str or not tenant or len(tenant) > SINK_NAME_CHARS_MAX:
            return invalid("tenants", "each tenant must be a non-empty string")
    if list(tenants) != sorted(set(tenants)):
        return invalid("tenants", "tenants must be sorted and unique")
    return None


def check_key_field(key_field: object) -> Rejected | None:
    if key_field is None:
        return None
    if type(key_field) is not str or not key_field or len(key_field) > KEY_FIELD_CHARS_MAX:
        return invalid(
            "key_field", f"key_field must be a non-empty string of at most {KEY_FIELD_CHARS_MAX}"
        )
    return None


def redacted_url(url: str) -> str:
    """`url` with its password (if any) replaced by `***`; a comma-separated
    list of URLs (a NATS cluster's servers) each so."""
    if "," in url:
        return ",".join(redacted_url(part) for part in url.split(","))
    try:
        parts = urlsplit(url)
    except ValueError:
        return "***"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = f"{user}:***@{host}" + (f":{port}" if port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def redacted(sink: Sink) -> dict[str, Any]:
    """The sink as the API shows it: its kind and options, URLs without passwords."""
    shown: dict[str, Any] = {"kind": sink.kind}
    for name, value in sink.options:
        shown[name] = redacted_url(value) if name == "url" and type(value) is str else value
    return shown


# -- codec ----------------------------------------------------------------------------


def encode_sink(sink: Sink | None) -> Any:
    if sink is None:
        return None
    return [sink.kind, [[name, value] for name, value in sink.options]]


def decode_sink(row: object) -> Sink | None:
    if row is None:
        return None
    if not isinstance(row, (tuple, list)) or len(row) != 2:
        raise CodecError("a sink is [kind, options]")
    kind: Any = row[0]
    options: Any = row[1]
    if type(kind) is not str or type(options) not in (tuple, list):
        raise CodecError("a sink is [kind, options]")
    pairs: list[tuple[str, str | int]] = []
    for pair in options:
        if type(pair) not in (tuple, list) or len(pair) != 2 or type(pair[0]) is not str:
            raise CodecError("a sink option is [name, value]")
        if type(pair[1]) not in (str, int):
            raise CodecError("a sink option's value is a string or an integer")
        pairs.append((pair[0], pair[1]))
    return Sink(kind, tuple(pairs))


def encode_tenants(tenants: tuple[str, ...] | None) -> Any:
    return None if tenants is None else list(tenants)


def decode_tenants(row: object) -> tuple[str, ...] | None:
    if row is None:
        return None
    if not isinstance(row, (tuple, list)) or not all(type(item) is str for item in row):
        raise CodecError("tenants are an array of strings")
    return tuple(row)
