"""pb_utils.ModelConfig, the object given to and returned by auto_complete_config, plus model-config dict helpers."""

import json

__all__ = ["ModelConfig", "using_decoupled_model_transaction_policy"]


def using_decoupled_model_transaction_policy(model_config):
    """Whether the model-config dict sets model_transaction_policy.decoupled."""
    if "model_transaction_policy" in model_config:
        return model_config["model_transaction_policy"]["decoupled"]
    return False


class ModelConfig:
    """Model configuration that auto_complete_config may complete.

    Built from the JSON form of Triton's ModelConfig protobuf (a str, as Triton
    passes it, or an already decoded dict). The stub reads the final
    configuration back from the `_model_config` attribute, as Triton does.
    All validation errors are ValueError with Triton's texts.
    """

    def __init__(self, model_config):
        if not isinstance(model_config, dict):
            model_config = json.loads(model_config)
        # Triton's JSON always carries these (primitive and repeated fields
        # are always printed), so fill them in when a caller left them out.
        model_config.setdefault("max_batch_size", 0)
        model_config.setdefault("input", [])
        model_config.setdefault("output", [])
        self._model_config = model_config

    def _name(self):
        return self._model_config["name"]

    def as_dict(self):
        """The configuration dict itself (meant as read-only)."""
        return self._model_config

    def set_max_batch_size(self, max_batch_size):
        """Set max_batch_size; it may not go below a value already configured."""
        current = self._model_config["max_batch_size"]
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in "
                f"auto-complete-config function for model '{self._name()}' "
                f"specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self):
        """Use dynamic_batching unless another scheduler is configured."""
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', "
                    f"but auto-complete-config function for model '{self._name()}' "
                    "tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input):
        """Add an input, or complete the configured input of the same name."""
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output):
        """Add an output, or complete the configured output of the same name."""
        self._add_tensor("output", output, ("name", "data_type", "dims"))

    def _add_tensor(self, kind, tensor, valid_properties):
        model = self._name()
        for prop in tensor:
            if prop not in valid_properties:
                listed = ", ".join(f"'{p}'" for p in valid_properties[:-1])
                raise ValueError(
                    f"{kind} '{tensor['name']}' in auto-complete-config function "
                    f"for model '{model}' contains property other than "
                    f"{listed} and '{valid_properties[-1]}'."
                )
        if "name" not in tensor:
            raise ValueError(f"{kind} in auto-complete-config function for model '{model}' is missing 'name' property.")
        for required in ("data_type", "dims"):
            if required not in tensor:
                raise ValueError(
                    f"{kind} '{tensor['name']}' in auto-complete-config function "
                    f"for model '{model}' is missing '{required}' property."
                )

        name = tensor["name"]
        for current in self._model_config[kind]:
            if current["name"] != name:
                continue
            if current["data_type"] != "TYPE_INVALID" and current["data_type"] != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{model}', configuration expects "
                    f"datatype {current['data_type']} for {kind} '{name}', "
                    f"model provides {tensor['data_type']}"
                )
            if current["dims"] and current["dims"] != tensor["dims"]:
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects dims "
                    f"{tensor['dims']} but the model configuration specifies "
                    f"dims {current['dims']}"
                )
            if "optional" in current and "optional" in tensor and current["optional"] != tensor["optional"]:
                raise ValueError(
                    f"model '{model}', tensor '{name}': the model expects "
                    f"optional {tensor['optional']} but the model configuration "
                    f"specifies optional {current['optional']}"
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(tensor)

    def set_model_transaction_policy(self, transaction_policy_dict):
        """Set model_transaction_policy (only 'decoupled'); it may not change a configured value."""
        for prop in transaction_policy_dict:
            if prop != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function "
                    f"for model '{self._name()}' contains property other than "
                    "'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            decoupled = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != decoupled:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config "
                    f"for model '{self._name()}', which is already set to "
                    f"'{policy['decoupled']}'."
                )
            policy["decoupled"] = decoupled
