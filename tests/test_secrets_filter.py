"""The one secret filter (verlflow.secrets): what counts as a secret, and no false alarm on a real verl config."""

from __future__ import annotations

import pytest

from verlflow import config, secrets
from verlflow.secrets import is_secret, mask_text, mask_tree

AWS = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ2aWN0aW0ifQ.c2lnbmF0dXJlLXZhbHVl"


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
    ("+trainer.dbPassword=Hunter2x +trainer.wandb_pass=Hunter3x", "+trainer.dbPassword=*** +trainer.wandb_pass=***"),
    ("ssh_passphrase: open sesame", "ssh_passphrase: *** sesame"),
    ("+trainer.hmac_key=abcdef123 +trainer.bearer=abcdef456 +trainer.session_cookie=abcdef789 +trainer.pw=abcdef",
     "+trainer.hmac_key=*** +trainer.bearer=*** +trainer.session_cookie=*** +trainer.pw=***"),
    ("DB_PASS2=Hunter4x data.prompt_key=question", "DB_PASS2=*** data.prompt_key=question"),
    ("https://dash.example/x?session=s3ss10nvalue&page=2", "https://dash.example/x?session=***&page=2"),
    ("/data/pass=hunter5/train.parquet not found", "/data/pass=*** not found"),
    ("jwt " + JWT + " in text", "jwt *** in text"),
    ("Authorization: Bearer abcdefghijklmnop", "Authorization: Bearer ***"),
    ("key file:\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----\nend",
     "key file:\n***\nend"),
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


@pytest.mark.parametrize("key", ["dbPassword", "wandb_pass", "ssh_passphrase", "hmac_key", "bearer", "session_cookie",
                                 "pw", "jwt", "DB_PASS2", "+trainer.apiKey", "trainer.private_key", "x.authorization"])
def test_a_key_names_a_secret_by_its_last_word(key):
    assert secrets.key_names_secret(key)


@pytest.mark.parametrize("key", ["data.prompt_key", "data.reward_fn_key",
                                 "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                                 "trainer.bypass_check", "trainer.session_name", "passes", "trainer.compass_heading"])
def test_a_key_whose_last_word_names_no_secret_is_left_alone(key):
    assert not secrets.key_names_secret(key)


def test_an_environment_variable_named_by_a_last_word_is_a_secret(monkeypatch):
    monkeypatch.setenv("DB_PASS2", "Hunter6xyz")
    assert secrets.looks_secret("DB_PASS2") and mask_text("connected with Hunter6xyz") == "connected with ***"


def test_a_long_chain_of_assignments_is_read_without_recursion():
    chained = "a:" * 5000 + "b pass=" + "c=" * 5000 + "d"
    assert mask_text(chained, known=set()) == "a:" * 5000 + "b pass=***"
