"""The migrations table: every row names one config model, an old key that is no key any more and a
new key that is one; the keys a removal lists are the ones it says."""

import pytest
from pydantic import BaseModel

from envrl.config_migrations import DECLARED_ENV_KEYS, MIGRATIONS, Migration, refused
from envrl.config_schema import types_at_path
from envrl.envclient.config import DeclaredEnvConfig
from tests.support.config_models import ENTRY_POINTS, models_in

MODELS = {model for entry in ENTRY_POINTS for model in models_in(entry, set())}


def model_named(name: str) -> type[BaseModel]:
    """The one config model (or base of one) of that class name that an entry point reads."""
    found = {base for model in MODELS for base in model.__mro__ if base.__name__ == name}
    assert len(found) == 1, f"{name}: {len(found)} config models of that name"
    return found.pop()


@pytest.mark.parametrize("row", MIGRATIONS, ids=lambda row: f"{row.model}.{row.old}")
def test_every_row_moves_a_key_that_is_gone_to_one_that_exists(row: Migration) -> None:
    model = model_named(row.model)
    assert types_at_path(model, row.old.split(".")) is None, f"{row.model}.{row.old} is still a key"
    if row.new is None:
        assert row.note, f"{row.model}.{row.old}: a removed key says what took its place"
    else:
        assert types_at_path(model, row.new.split(".")), f"{row.model}: {row.old} -> {row.new}, which is no key"


def test_an_eval_table_refuses_every_key_of_an_env_declaration_but_sampling() -> None:
    assert set(DECLARED_ENV_KEYS) == set(DeclaredEnvConfig.model_fields) - {"sampling"}


def test_a_row_warns_before_its_version_and_is_refused_from_it() -> None:
    row = Migration("RLConfig", "trainer.gpus", "placement.trainer.gpus", removed_in="0.3.0")
    assert not refused(row, "0.2.0") and not refused(row, "0.2.9")
    assert refused(row, "0.3.0") and refused(row, "1.0.0")
