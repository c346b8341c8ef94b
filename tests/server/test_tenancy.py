"""Tenant isolation of the prefix cache, through a real server on both backends.

`usage.prompt_tokens_details.cached_tokens` tells a caller how much of its prompt was cached. If
tenants shared the cache, that number would be an oracle on another tenant's prompts: these
tests play the attacker (with the official openai client) and check it learns nothing, while a
tenant still gets its own hits, and `cache_salt` splits callers within one key.
"""

from __future__ import annotations

import random
import uuid
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from starlette.requests import Request

from lantern.server.app import ServerSettings
from lantern.server.tenancy import ANONYMOUS, SCOPE_KEY, TenantKeys, cache_salt_for, tenant_id
from tests.server.conftest import start_server

KEY_A, KEY_B = "tenant-a-key", "tenant-b-key"
BLOCK = 4  # conftest's block_size
SUFFIX = (
    "Paged attention stores keys and values in blocks. Continuous batching lets new requests join while others decode."
)


# ---- unit: ids, keys, salts --------------------------------------------------------------------
def test_tenant_ids_are_stable_and_do_not_contain_the_key():
    tid = tenant_id(KEY_A)
    assert tid == tenant_id(KEY_A) != tenant_id(KEY_B)
    assert len(tid) == 16 and int(tid, 16) >= 0 and KEY_A not in tid and tid != ANONYMOUS


def test_tenant_keys_identify_exact_keys_only():
    keys = TenantKeys([KEY_A, KEY_B, KEY_A])
    assert len(keys) == 2
    assert keys.identify(KEY_A.encode()) == tenant_id(KEY_A)
    assert keys.identify(KEY_B.encode()) == tenant_id(KEY_B)
    for wrong in (b"", KEY_A[:-1].encode(), KEY_A.encode() + b"x", b"\xff" + KEY_B.encode()):
        assert keys.identify(wrong) is None
    assert not TenantKeys([])


def test_cache_salt_joins_tenant_and_request_salt():
    def request(state: dict | None) -> Request:
        scope = {"type": "http", "headers": []}
        if state is not None:
            scope["state"] = state
        return Request(scope)

    a = request({SCOPE_KEY: tenant_id(KEY_A)})
    assert cache_salt_for(a, "x") == f"{tenant_id(KEY_A)}\0x"
    assert cache_salt_for(a, None) == cache_salt_for(a, "") == f"{tenant_id(KEY_A)}\0"
    assert cache_salt_for(request(None), "x") == f"{ANONYMOUS}\0x"
    # Whatever salt B sends, its cache salt starts with B's tenant id: never equal to any of A's.
    b, ta = request({SCOPE_KEY: tenant_id(KEY_B)}), tenant_id(KEY_A)
    for salt in ("", "x", ta, f"{ta}\0x", f"\0{ta}\0x"):
        assert cache_salt_for(b, salt).split("\0", 1)[0] == tenant_id(KEY_B)


# ---- a live server per backend -----------------------------------------------------------------
@pytest.fixture(scope="module", params=["torch", "mlx"])
def server(request, tiny_model_dir):
    pytest.importorskip("mlx.core" if request.param == "mlx" else "torch")
    # api_key and api_keys are merged: both are tenants.
    settings = ServerSettings(served_model_name="tiny", api_key=KEY_A, api_keys=[KEY_B])
    srv = start_server(tiny_model_dir("llama2"), settings, backend=request.param)
    touch_pool(srv)
    yield srv
    srv.stop()


def touch_pool(server, n: int = 24) -> None:
    """Run n long requests at once. On CPU torch the KV pool is committed lazily and freed blocks
    are reused (evicting their cached prefixes, least recently freed first) before untouched
    ones: until a peak has touched enough blocks, every request would evict the prefixes these
    tests look for. After this, only stale blocks are evicted, as on a server that has run."""
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY_B, max_retries=0, timeout=120)
    with ThreadPoolExecutor(n) as pool:
        list(
            pool.map(
                lambda i: client.completions.create(
                    model="tiny", prompt=f"{i} warm {SUFFIX} {SUFFIX}", max_tokens=8, temperature=0
                ),
                range(n),
            )
        )


@pytest.fixture(scope="module")
def clients(server):
    def make(key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0, timeout=120)

    return make(KEY_A), make(KEY_B)


def cached(client: openai.OpenAI, prompt: str, salt: str | None = None) -> int:
    extra = {"cache_salt": salt} if salt is not None else None
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=1, temperature=0, extra_body=extra)
    return r.usage.prompt_tokens_details.cached_tokens


def cached_chat(client: openai.OpenAI, text: str) -> int:
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": text}], max_tokens=1, temperature=0
    )
    return r.usage.prompt_tokens_details.cached_tokens


def fresh(text: str) -> str:
    """A prompt no earlier request shares a block with (the tag comes first)."""
    return f"{uuid.uuid4().hex[:8]} {text}"


def test_a_wrong_key_is_refused(server):
    bad = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="not-a-tenant", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        cached(bad, "hello")


def probe(
    owner: openai.OpenAI,
    prompt: str,
    prober: openai.OpenAI,
    probe_prompt: str | None = None,
    owner_salt: str | None = None,
    probe_salt: str | None = None,
) -> int:
    """cached_tokens the prober sees right after the owner's prompt was (again) served from the
    cache. Re-warming first matters on CPU torch: its lazily committed pool reuses freed blocks
    before fresh ones, so any other request may evict cached prefixes; here the owner's blocks
    are the most recently freed when the probe looks them up."""
    if cached(owner, prompt, owner_salt) == 0:  # evicted meanwhile: now it is cached again
        assert cached(owner, prompt, owner_salt) > 0, "the owner's prompt is not cached"
    return cached(prober, probe_prompt or prompt, probe_salt)


def test_another_tenant_never_hits_a_tenants_prefix(clients):
    a, b = clients
    prompt = fresh(f"The quick brown fox jumps over the lazy dog. {SUFFIX}")
    assert cached(a, prompt) == 0
    hit = cached(a, prompt)
    assert hit >= 40  # A's repeat is served from the cache ...
    assert cached(b, prompt) == 0  # ... B's identical prompt is not
    assert cached(b, prompt) == hit  # B's own repeat hits (the cache works for B too)
    text = fresh(f"Lantern serves language models. {SUFFIX}")
    assert cached_chat(a, text) == 0
    assert cached_chat(a, text) > 0
    assert cached_chat(b, text) == 0


def test_cache_salt_isolates_within_a_key_and_equal_salts_share(clients):
    a, b = clients
    prompt = fresh(f"Numbers 0123456789 and punctuation. {SUFFIX}")
    assert cached(a, prompt, "alice") == 0
    assert probe(a, prompt, a, owner_salt="alice", probe_salt="bob") == 0
    assert probe(a, prompt, a, owner_salt="alice") == 0  # no salt is a salt of its own
    assert probe(a, prompt, b, owner_salt="alice", probe_salt="alice") == 0  # same salt, other tenant
    hit = probe(a, prompt, a, owner_salt="alice", probe_salt="alice")  # equal salts share
    assert hit >= 40


def divergence(tokenize, prompts: list[str]) -> int:
    """The token index at which every pair of these prompts first differs (asserted common)."""
    seqs = [tokenize(p) for p in prompts]
    firsts = set()
    for i, s in enumerate(seqs):
        for t in seqs[i + 1 :]:
            firsts.add(next(k for k, (x, y) in enumerate(zip(s, t)) if x != y))
    assert len(firsts) == 1 and len({len(s) for s in seqs}) == 1, (firsts, [len(s) for s in seqs])
    return firsts.pop()


def pick_candidates(tokenize, template: str, decoy: str, rng: random.Random) -> list[str]:
    """Up to nine PINs, one per first digit other than the decoy's, each tokenized to the same
    length as the decoy (so digit merges do not shift positions): then, without other tenants'
    blocks, every candidate hits exactly the attacker's own cached prefix, the same for all."""
    shape = len(tokenize(template.format(pin=decoy)))
    picked = []
    for first in "0123456789".replace(decoy[0], ""):
        pins = (f"{first}{rng.randrange(1000):03d}" for _ in range(200))
        pin = next((p for p in pins if len(tokenize(template.format(pin=p))) == shape), None)
        if pin is not None:  # some digits merge with what follows whatever comes next
            picked.append(pin)
    assert len(picked) >= 6, picked
    return picked


def attack(
    owner: openai.OpenAI, attacker: openai.OpenAI, template: str, secret: str, decoy: str, candidates: list[str]
) -> list[int]:
    """The attacker warms its own cache with the known text around the PIN (a decoy PIN), then
    reads cached_tokens for each candidate, each time right after the owner used its prompt."""
    cached(attacker, template.format(pin=decoy))
    return [probe(owner, template.format(pin=secret), attacker, template.format(pin=c)) for c in candidates]


def test_the_pin_oracle_reveals_nothing_across_tenants(server, clients):
    a, b = clients
    rng = random.Random(9)
    decoy = "9999"
    template = fresh("The assistant keeps a secret. The PIN is {pin}. " + SUFFIX)
    tokenize = server.engine.encode
    candidates = pick_candidates(tokenize, template, decoy, rng)
    d = divergence(tokenize, [template.format(pin=p) for p in [decoy, *candidates]])
    length = len(tokenize(template.format(pin=decoy)))
    assert d + 2 * BLOCK < length  # a full-prompt hit would stand out from a prefix hit

    secret = candidates[rng.randrange(len(candidates))]
    assert cached(a, template.format(pin=secret)) == 0
    seen_by_b = attack(a, b, template, secret, decoy, candidates)
    assert len(set(seen_by_b)) == 1, dict(zip(candidates, seen_by_b))  # no signal at all
    assert seen_by_b[0] == d // BLOCK * BLOCK  # B sees its own warm-up prefix, nothing more

    # Control: the same attack from inside tenant A finds the PIN, so the probe above could
    # have seen a leak if there were one.
    seen_by_a = attack(a, a, template, secret, decoy, candidates)
    best = max(range(len(candidates)), key=seen_by_a.__getitem__)
    assert candidates[best] == secret
    assert sorted(seen_by_a)[-2] < seen_by_a[best]
