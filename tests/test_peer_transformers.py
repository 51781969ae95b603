"""transformers' own Inkling test configurations, replayed as clients of the kit.

The tiny configs of ``tests/models/inkling/test_modeling_inkling.py`` (its text tester on
``tests/causal_lm_tester.py``'s defaults: hidden 32, ``hidden_act="gelu"``, 2 layers with
the second sparse, ``moe_intermediate_size`` 16, the config's 2 shared experts; the
vision and audio testers wrap that same text config), restated in our words: the kit's
sink computes ``InklingSharedExperts.forward`` in every dtype with the tolerances
transformers' tests use (``torch.testing.assert_close``'s per dtype), and the model's own
sink output through a hook; checkpoints written by ``save_pretrained`` in both formats,
one file and sharded, read back to the same sink, the format said.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from inkling_lab.sink import ACTIVATIONS
from inkling_lab.transformers_interop import sink_from_checkpoint, sink_from_transformers
from peers import installed

pytestmark = pytest.mark.skipif(not installed("transformers.models.inkling"),
                                reason="transformers >= 5.24 (Inkling) is not installed")

TEXT_TESTER = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                   intermediate_size=37, hidden_act="gelu", max_position_embeddings=512, pad_token_id=0,
                   bos_token_id=1, eos_token_id=2, layer_types=["hybrid_sliding", "hybrid"],
                   mlp_layer_types=["dense", "sparse"], moe_intermediate_size=16, n_routed_experts=16)
"""InklingTextModelTester (test_modeling_inkling.py) on CausalLMModelTester's defaults."""
VISION = {"patch_size": 5, "num_hidden_layers": 2, "num_channels": 3}
AUDIO = {"hidden_size": 32, "n_mel_bins": 4, "mel_vocab_size": 8}
"""InklingAudio2TextModelTester's vision and audio configs (the vision tester's text config is the same)."""
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _text_model(hidden_act: str = "gelu", dtype: torch.dtype = torch.float32) -> InklingForCausalLM:
    from transformers import InklingForCausalLM, InklingTextConfig

    torch.manual_seed(0)
    return InklingForCausalLM(InklingTextConfig(**{**TEXT_TESTER, "hidden_act": hidden_act})).to(dtype).eval()


def _multimodal_model(monkeypatch: pytest.MonkeyPatch) -> InklingForConditionalGeneration:
    """InklingForConditionalGeneration of the audio tester's config. Its vision tower needs
    scipy to plan its scales; where scipy is absent the tower (no part of the sink nor of
    its checkpoint names) is left out."""
    from transformers import InklingConfig, InklingForConditionalGeneration
    from transformers.models.inkling import modeling_inkling

    try:
        import scipy  # noqa: F401
    except ImportError:
        monkeypatch.setattr(modeling_inkling, "InklingVisionModel", lambda config: torch.nn.Module())
    torch.manual_seed(0)
    config = InklingConfig(text_config=TEXT_TESTER, vision_config=VISION, audio_config=AUDIO, image_token_id=4,
                           boi_token_id=5, eoi_token_id=6, audio_token_id=7, video_token_id=10)
    return InklingForConditionalGeneration(config).eval()


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_every_activation_the_kit_computes_is_transformers_own(name):
    """ACT2FN (transformers.activations) is what InklingSharedExperts calls: the kit's table agrees."""
    from transformers.activations import ACT2FN

    x = torch.linspace(-8, 8, 1001, dtype=torch.float64)
    torch.testing.assert_close(ACTIVATIONS[name](x), ACT2FN[name](x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden_act", ["gelu", "silu"])
def test_the_sink_computes_inkling_shared_experts_forward_in_every_dtype(dtype, hidden_act):
    """test_modeling_inkling.py's text tester (gelu), and the config's default (silu)."""
    experts = _text_model(hidden_act, dtype).model.layers[1].mlp.shared_experts
    sink = sink_from_transformers(experts)
    assert sink.activation == hidden_act and sink.dtype == dtype
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, 32, generator=gen).to(dtype)
    gammas = torch.rand(3, 7, 2, generator=gen).to(dtype)
    with torch.no_grad():
        want = experts(x, gammas)
    torch.testing.assert_close(sink(x, gammas), want)  # transformers' tests' tolerances for this dtype
    torch.testing.assert_close(sink.base_forward(x, gammas, form="per_expert"), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_sink_computes_the_model_s_own_sink_output_through_a_hook(dtype):
    """CausalLMModelTest's forward on the text tester: the sink's input and output taken
    from inside the model as it runs."""
    model = _text_model(dtype=dtype)
    experts = model.model.layers[1].mlp.shared_experts
    seen = {}
    experts.register_forward_hook(lambda module, args, kwargs, out: seen.update(args=args, kwargs=kwargs, out=out),
                                  with_kwargs=True)
    ids = torch.randint(3, 99, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model(input_ids=ids)
    x, gammas = (*seen["args"], *seen["kwargs"].values())
    torch.testing.assert_close(sink_from_transformers(experts)(x, gammas), seen["out"])


@pytest.mark.parametrize("original", [True, False], ids=["published", "transformers"])
@pytest.mark.parametrize("shard", ["50GB", "20KB"], ids=["one_file", "sharded"])
def test_save_pretrained_checkpoints_read_back_to_the_model_s_sink(original, shard, tmp_path, monkeypatch):
    """The multimodal model saved as transformers saves it (save_original_format, max_shard_size)."""
    model = _multimodal_model(monkeypatch)
    experts = model.model.language_model.layers[1].mlp.shared_experts
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp_path, save_original_format=original, max_shard_size=shard)
    sink = sink_from_checkpoint(tmp_path, layer=1)
    said = sink.checkpoint
    assert said.format == ("published" if original else "transformers")
    assert said.prefix == ("model.llm.layers.1.mlp.shared_experts" if original
                           else "model.language_model.layers.1.mlp.shared_experts")
    assert said.activation == "gelu" and "text_config.hidden_act" in said.activation_from
    assert ("shared_w13_weight" in str(said)) == original and (len(said.files) >= 1)
    assert all(f.startswith("model-") for f in said.files) == (shard == "20KB")
    want = sink_from_transformers(experts)
    assert torch.equal(sink.w13, want.w13) and torch.equal(sink.w2, want.w2)
    x, gammas = torch.randn(5, 32), torch.rand(5, 2)
    with torch.no_grad():
        torch.testing.assert_close(sink(x, gammas), experts(x, gammas))
    with pytest.raises(KeyError, match=r"the layers with shared experts are \[1\]"):
        sink_from_checkpoint(tmp_path, layer=0)  # the tester's first layer is dense


def test_the_text_model_saves_transformers_names_in_either_format(tmp_path):
    """InklingForCausalLM has no conversion mapping: save_original_format changes nothing."""
    model = _text_model()
    for original in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.save_pretrained(tmp_path / str(original), save_original_format=original)
        sink = sink_from_checkpoint(tmp_path / str(original), layer=1)
        assert sink.checkpoint.format == "transformers" and sink.activation == "gelu"
        assert torch.equal(sink.w2, model.model.layers[1].mlp.shared_experts.down_proj)


def test_the_doctor_says_sglang_computes_silu_for_the_tester_s_gelu_model():
    """The text tester's hidden_act: sglang's sink serves SiLU, so nothing it serves is the model's."""
    from pathlib import Path

    from inkling_lab.doctor import doctor

    sample = Path(__file__).resolve().parents[1] / "data" / "adapters" / "gate_up"
    gelu = doctor(sample, 2, 8, 6, hidden_act=TEXT_TESTER["hidden_act"])
    (w113,) = [f for f in gelu.findings if f.code == "ISL-W113"]
    assert "gelu(gate) * up" in w113.message and "silu(gate) * up" in w113.message
    assert gelu.computes.outcome == "different" and gelu.exit_status == 1
    silu = doctor(sample, 2, 8, 6)
    assert "ISL-W113" not in [f.code for f in silu.findings] and silu.exit_status == 0
