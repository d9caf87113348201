"""A Triton model folder checked the way Triton's TensorFlow backend checks it.

config.pbtxt is parsed with the `model_config` protobuf that Triton's own Python client
package ships (`tritonclient.grpc.model_config_pb2`), so a field Triton does not know, or a
malformed value, fails here as it fails in the server. Then each input and output is compared
with the SavedModel's signature the config names (`parameters` TF_SIGNATURE_DEF, Triton's
TensorFlow backend's way to choose one; `serving_default` without it) as the backend does: same name, same type,
and, with `max_batch_size` > 0, the signature's shape equal to [-1] followed by the config's
`dims`, or by `reshape.shape` when a reshape is given (so a per-example scalar is dims [1]
with `reshape: { shape: [ ] }`). Every signature input must be in the config (Triton feeds
only those); outputs may be a subset.
"""
import os

import pytest

_TYPES = {"TYPE_INT32": "int32", "TYPE_INT64": "int64", "TYPE_FP32": "float32",
          "TYPE_FP16": "float16"}


def parse_config(path):
    """The ModelConfig message of a config.pbtxt (skips the test without tritonclient)."""
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError:
        pytest.skip("oracle package tritonclient not installed (bash scripts/install.sh "
                    "--oracles)")
    with open(path, encoding="utf-8") as reader:
        return text_format.Parse(reader.read(), model_config_pb2.ModelConfig())


def signature_tensors(saved_model, signature="serving_default"):
    """({input name: (dtype, shape)}, {output name: (dtype, shape)}) of `signature`, shapes
    with -1 for unknown dimensions."""
    import tensorflow as tf
    function = tf.saved_model.load(saved_model).signatures[signature]
    describe = lambda spec: (spec.dtype.name, [-1 if d is None else d  # noqa: E731
                                               for d in spec.shape.as_list()])
    inputs = {name: describe(spec) for name, spec in
              function.structured_input_signature[1].items()}
    outputs = {name: describe(spec) for name, spec in function.structured_outputs.items()}
    return inputs, outputs


def check_model(model_folder, version=1):
    """Parses `model_folder/config.pbtxt`, compares it with the SavedModel in
    `<version>/model.savedmodel`; returns the ModelConfig. Fails with what Triton would say."""
    config = parse_config(os.path.join(model_folder, "config.pbtxt"))
    saved_model = os.path.join(model_folder, str(version), "model.savedmodel")
    assert os.path.isfile(os.path.join(saved_model, "saved_model.pb")), saved_model
    assert config.name == os.path.basename(model_folder.rstrip("/")), config.name
    assert config.platform == "tensorflow_savedmodel"
    chosen = config.parameters["TF_SIGNATURE_DEF"].string_value \
        if "TF_SIGNATURE_DEF" in config.parameters else "serving_default"
    inputs, outputs = signature_tensors(saved_model, chosen)
    assert {t.name for t in config.input} == set(inputs), (list(config.input), inputs)
    for kind, tensors, signature in (("input", config.input, inputs),
                                     ("output", config.output, outputs)):
        for tensor in tensors:
            assert tensor.name in signature, f"{kind} {tensor.name}: not in the signature"
            dtype, shape = signature[tensor.name]
            from tritonclient.grpc import model_config_pb2
            type_name = model_config_pb2.DataType.Name(tensor.data_type)
            assert _TYPES[type_name] == dtype, (tensor.name, type_name, dtype)
            assert list(tensor.dims), f"{kind} {tensor.name}: Triton refuses empty dims"
            expected = list(tensor.reshape.shape) if tensor.HasField("reshape") \
                else list(tensor.dims)
            if config.max_batch_size > 0:
                expected = [-1] + expected
            assert expected == shape, (f"{kind} {tensor.name}: config means {expected}, the "
                                       f"signature has {shape}")
    return config
