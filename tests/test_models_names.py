"""Model strings: provider prefixes, and bare names as the providers (and the seeds) write them."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("anthropic")
pytest.importorskip("openai")

from tether import Agent
from tether.models import resolve_model
from tether.models.anthropic import AnthropicModel
from tether.models.openai import OpenAIModel
from tether.models.openai_responses import OpenAIResponsesModel


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "a-key")
    monkeypatch.setenv("OPENAI_API_KEY", "o-key")


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("claude-sonnet-4-5", AnthropicModel),
        ("claude-3-5-haiku-20241022", AnthropicModel),
        ("gpt-4o-mini", OpenAIModel),
        ("gpt-4.1", OpenAIModel),
        ("chatgpt-4o-latest", OpenAIModel),
        ("o1", OpenAIModel),
        ("o3-mini", OpenAIModel),
        ("o4-mini", OpenAIModel),
        ("anthropic:claude-x", AnthropicModel),
        ("openai:llama3", OpenAIModel),
        ("openai-responses:gpt-5", OpenAIResponsesModel),
    ],
)
def test_names_resolve_to_their_provider(name: str, kind: type) -> None:
    made = resolve_model(name)
    assert type(made) is kind
    assert made.name == name.partition(":")[2] or made.name == name


def test_an_agent_takes_a_bare_name_as_the_seeds_write_it() -> None:
    agent = Agent(model="claude-sonnet-4-5")
    assert isinstance(agent.model, AnthropicModel) and agent.model.name == "claude-sonnet-4-5"
    assert isinstance(Agent(model="gpt-4o-mini").model, OpenAIModel)


@pytest.mark.parametrize("name", ["llama3", "mistral-large", "gemini-2.5-pro", "o2-x", "nope:x", "openai:"])
def test_an_unknown_name_says_which_prefixes_exist(name: str) -> None:
    with pytest.raises(ValueError) as info:
        resolve_model(name)
    message = str(info.value)
    assert f"model {name!r}" in message
    assert "Fix: use 'anthropic:<model>', 'openai:<model>' or 'openai-responses:<model>'" in message


def test_a_bare_name_without_its_sdk_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)
    monkeypatch.delitem(sys.modules, "tether.models.openai", raising=False)
    monkeypatch.delitem(sys.modules, "tether.models.openai_responses", raising=False)
    for name in ("gpt-4o-mini", "openai-responses:o4-mini"):
        with pytest.raises(ValueError) as info:
            resolve_model(name)
        assert "Fix: pip install 'tether[openai]'" in str(info.value)


def test_import_tether_imports_neither_an_sdk_nor_genai_prices() -> None:
    code = (
        "import sys, tether, tether.models, tether.budgets; "
        "print(*(m in sys.modules for m in ('anthropic', 'openai', 'genai_prices')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]
