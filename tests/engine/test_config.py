import pytest

from defectdet.engine.config import TrainConfig, load_config
from defectdet.errors import ConfigError


def test_unknown_yaml_key_is_named_with_suggestion(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("epochs: 3\nlearning_rate: 0.1\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(path) in str(error.value) and "'learning_rate'" in str(error.value)
    path.write_text("epochs: 3\nbatchh: 4\n")
    with pytest.raises(ConfigError, match="did you mean 'batch'"):
        load_config(path)


def test_unknown_override_and_nested_keys():
    with pytest.raises(ConfigError, match="'epoch'.*did you mean 'epochs'"):
        load_config(None, {"epoch": 3})
    with pytest.raises(ConfigError, match="augment.rotate_degree"):
        load_config(None, {"augment.rotate_degree": 3})
    config = load_config(None, {"augment.rotate_degrees": 2.0, "batch": 4})
    assert config.batch == 4 and config.augment.rotate_degrees == 2.0


def test_yaml_plus_overrides_and_defaults(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("optimizer: sgd\ntime_minutes: 5\n")
    config = load_config(path, {"seed": 7})
    assert config.lr == 0.01 and config.weight_decay == 0.0005  # SGD defaults resolved
    assert config.epochs is None and config.time_budget_seconds == 300 and config.seed == 7
    assert TrainConfig().epochs == 50  # neither budget given: default epochs


def test_invalid_value_names_field(tmp_path):
    with pytest.raises(ConfigError, match="'batch'"):
        load_config(None, {"batch": 0})
    path = tmp_path / "bad.yaml"
    path.write_text("epochs: [1\n")
    with pytest.raises(ConfigError, match="bad.yaml:"):
        load_config(path)
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(path)
