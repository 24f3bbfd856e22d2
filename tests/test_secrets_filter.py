"""The one secret filter (verlflow.secrets): what counts as a secret, and no false alarm on a real verl config."""

from __future__ import annotations

import pytest

from verlflow import config, secrets
from verlflow.secrets import is_secret, mask_text, mask_tree

AWS = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize(("text", "shown"), [
    ("+trainer.wandb_password=Summer2024!", "+trainer.wandb_password=***"),
    (f"+trainer.aws_secret_access_key={AWS} trainer.total_epochs=1",
     "+trainer.aws_secret_access_key=*** trainer.total_epochs=1"),
    ("postgresql://bob:pw@db.example/x", "postgresql://***@db.example/x"),
    ("ray://head:10001?token=abc123&x=1", "ray://head:10001?token=***&x=1"),
    ("https://b.s3.amazonaws.com/k?X-Amz-Credential=AK%2F1&X-Amz-Signature=deadbeef",
     "https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Signature=***"),
    ("https://acct.blob.core.windows.net/c/f?sv=2024&sig=abcDEF%3D", "https://acct.blob.core.windows.net/c/f?sv=2024&sig=***"),
    ("id AKIAIOSFODNN7EXAMPLE and hf_" + "a1B2c3D4e5F6g7H8i9J0kLmN", "id *** and ***"),
    ("WANDB_API_KEY=" + "0123456789abcdef" * 2 + "01234567", "WANDB_API_KEY=***"),
])
def test_secrets_are_masked_and_the_text_keeps_its_shape(text, shown):
    assert mask_text(text, known=set()) == shown


def test_a_value_marked_secret_is_masked_wherever_it_appears(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "plain-words-value")
    monkeypatch.setenv("PWD", "/definitely/not/a/secret/folder")
    assert mask_text("sent plain-words-value to /definitely/not/a/secret/folder/x") == \
        "sent *** to /definitely/not/a/secret/folder/x"
    secrets.remember("marked-by-profile")
    assert mask_text("x=marked-by-profile") == "x=***"


def test_a_real_verl_config_holds_no_false_alarm():
    for recipe, profile in (("qwen3-4b-gsm8k-grpo", "a3"), ("qwen3-4b-gsm8k-grpo", "h20"), ("tiny", "cpu-verl")):
        tree = config.compose(recipe, profile).to_container()
        assert mask_tree(tree) == tree, (recipe, profile)
    assert not is_secret("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "16384")
    assert not is_secret("data.prompt_key", "prompt") and not is_secret("+trainer.api_key_file", "/home/b/key.txt")
    assert is_secret("+trainer.hub_token", "anything") and is_secret("+trainer.db_url", "mysql://u:p@h/d")
