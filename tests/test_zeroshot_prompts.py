"""LLM prompt sets as replaceable files, list-only answer parsing, EOE's near style (issue 14 item 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oodeval.zeroshot.llm_vocab import generate_eoe, generate_siblings, overlap_filter, parse_list
from oodeval.zeroshot.prompts import DEFAULT_PROMPTS, PLACEHOLDERS, load_prompts


class Recorder:
    """A ChatClient stand-in: answers from a function of the last user message, records every request."""

    model = "fake"

    def __init__(self, answer) -> None:
        self.answer, self.sent = answer, []

    def complete(self, messages, seed=None, **params):
        messages = [{"role": "user", "content": messages}] if isinstance(messages, str) else list(messages)
        self.sent.append(messages)
        return self.answer(messages[-1]["content"])


def test_answers_are_parsed_as_lists_only() -> None:
    answer = "Sure! Here are the siblings.\n- tabby cat\n* lynx\n1. ocelot\n2) Bobcat\n- Wild cats:\nHope this helps!"
    assert parse_list(answer) == ["tabby cat", "lynx", "ocelot", "Bobcat"]
    assert parse_list("sure! here are the siblings.") == []
    assert parse_list('```json\n["a b", "c"]\n```') == ["a b", "c"]
    assert parse_list("-not a bullet\n3.5 stars") == []  # a marker needs a space after it


def test_default_prompt_file_is_shipped_and_complete() -> None:
    texts = load_prompts()
    assert DEFAULT_PROMPTS.is_file() and set(texts) == set(PLACEHOLDERS)
    assert "{k}" in texts["siblings"] and "{batch}" in texts["eoe.near.first"]


def test_a_user_prompt_file_replaces_the_wording_exactly(tmp_path: Path) -> None:
    user = tmp_path / "mine.toml"
    user.write_text('siblings = "Siblings of [{name}], {k} of them:"\n'
                    '[eoe.fine_grained]\nfirst = "Q: {n_id} classes: [{id_names}]. Give {batch} others.\\nA:"\n'
                    'again = "Q: {batch} more, please.\\nA:"\n'
                    '[eoe.near]\nfirst = "Q: near [{name}], {batch} please.\\nA:"\n')
    client = Recorder(lambda prompt: "Here you go:\n- Alpha\n- beta\n- Beta\n- cat")
    vocab = generate_eoe(client, ["cat", "dog"], style="fine_grained", n_classes=4, batch=2, prompts=user)
    assert [m[-1]["content"] for m in client.sent] == ["Q: 2 classes: [cat; dog]. Give 2 others.\nA:", "Q: 2 more, please.\nA:"]
    assert vocab.labels == ["alpha", "beta"]  # lower-cased, de-duplicated, ID name "cat" removed, preamble ignored
    assert vocab.provenance["prompt_file"] == str(user) and vocab.provenance["prompts"]["eoe.fine_grained.again"] == "Q: {batch} more, please.\nA:"
    sib = Recorder(lambda prompt: "- kitten\n- lion")
    assert generate_siblings(sib, ["cat"], k=5, prompts=user, progress=False) == {"cat": ["kitten", "lion"]}
    assert sib.sent[0][0]["content"] == "Siblings of [cat], 5 of them:"


def test_eoe_near_asks_three_per_class_and_applies_the_word_overlap_filter() -> None:
    client = Recorder(lambda prompt: "- Golden Eagle\n- red panda\n- cat bed\n- retriever")
    vocab = generate_eoe(client, ["golden retriever", "tabby cat"], style="near")
    assert len(client.sent) == 2 and all("3" in m[0]["content"] for m in client.sent)
    assert '"golden retriever"' in client.sent[0][0]["content"]
    assert vocab.labels == ["red panda"]  # golden eagle, cat bed, retriever share a word with an ID name
    assert overlap_filter(["golden eagle", "sea otter"], ["golden retriever"]) == ["sea otter"]


@pytest.mark.parametrize("text, message", [
    ('siblings = "List {count} siblings of {name}"', "uses placeholders \\['count'\\]"),
    ('siblings = "a {name"', "malformed placeholder"),
    ('sibling = "x"', "unknown prompt keys"),
    ('[eoe.far]\nfirst = "{batch}"', "has no eoe.far.again"),
])
def test_bad_prompt_files_are_refused_before_any_request(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(text + "\n")
    client = Recorder(lambda prompt: "- x")
    with pytest.raises(ValueError, match=message):
        if "eoe" in text:
            generate_eoe(client, ["cat"], style="far", prompts=path)
        else:
            generate_siblings(client, ["cat"], prompts=path, progress=False)
    assert client.sent == []
