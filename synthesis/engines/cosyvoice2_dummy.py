"""A CosyVoice2 model folder with random weights, built from upstream's own classes.

No machine of this project can download CosyVoice2-0.5B, yet the adapter must meet
the real upstream code: the folder written here has every file `CosyVoice2(model_dir)`
opens, in the formats it expects, so upstream runs end to end (its output is noise).

- `tiny`: small enough for CI on a CPU (~70 MB, ~10 s to build). The flow encoder
  stays 512 wide because upstream hard-codes 512 in `PreLookaheadLayer` and `Upsample1D`.
- `full`: the shapes of the released 0.5B model (Qwen2-0.5B, the flow and HiFT of
  upstream's `cosyvoice2.yaml`), for measuring memory and speed on a GPU.

A random LLM almost never samples a stop token, so each text segment decodes to
upstream's cap (20 speech tokens per text token). `stop` sets the bias of the stop
logits: `capped` (never stop: lengths exactly 20 x text tokens, the default: tests
can size their audio), `short` (stop as soon as upstream allows: 2 x text tokens)
or `random` (no bias).

Upstream must be importable (COSYVOICE_SRC / `src_dir`); nothing of it, or of
torch, is imported before `build_dummy_model` runs.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STOPS = ("capped", "short", "random")
SPEECH_TOKENS = 6561  # upstream's speech-token vocabulary (FSQ, 3^8)
SAMPLE_RATE = 24000
EMBEDDING_DIM = 192
_STOP_BIAS = {"capped": -1.0e4, "short": 1.0e4, "random": 0.0}

# English text for the byte-level BPE of the tiny tokenizer: any text will do, the
# merges only decide how many tokens a sentence becomes.
_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Hello, world! How are you today? "
    "Speak cheerfully and clearly. This is a test of the voice service, with numbers "
    "one two three four five six seven eight nine ten. She sells sea shells by the "
    "sea shore. Please read the following sentence slowly, then the second one. "
)


@dataclass(frozen=True)
class Shape:
    """The hyper-parameters that differ between the two sizes."""

    qwen_hidden: int
    qwen_layers: int
    qwen_heads: int
    qwen_kv_heads: int
    qwen_intermediate: int
    qwen_vocab: int  # the full model keeps Qwen2's vocabulary; ids of the tiny BPE fit both
    bpe_vocab: int
    encoder_heads: int
    encoder_units: int
    encoder_blocks: int
    decoder_channels: int
    decoder_blocks: int
    decoder_mid_blocks: int
    decoder_heads: int
    decoder_head_dim: int
    hift_channels: int


SIZES = {
    "tiny": Shape(
        qwen_hidden=64,
        qwen_layers=2,
        qwen_heads=4,
        qwen_kv_heads=2,
        qwen_intermediate=128,
        qwen_vocab=1024,
        bpe_vocab=600,
        encoder_heads=8,
        encoder_units=512,
        encoder_blocks=1,
        decoder_channels=64,
        decoder_blocks=1,
        decoder_mid_blocks=1,
        decoder_heads=2,
        decoder_head_dim=32,
        hift_channels=64,
    ),
    # CosyVoice2-0.5B: Qwen2-0.5B and the flow/HiFT of upstream's cosyvoice2.yaml.
    "full": Shape(
        qwen_hidden=896,
        qwen_layers=24,
        qwen_heads=14,
        qwen_kv_heads=2,
        qwen_intermediate=4864,
        qwen_vocab=151936,
        bpe_vocab=2000,
        encoder_heads=8,
        encoder_units=2048,
        encoder_blocks=6,
        decoder_channels=256,
        decoder_blocks=4,
        decoder_mid_blocks=12,
        decoder_heads=8,
        decoder_head_dim=64,
        hift_channels=512,
    ),
}

_YAML = """\
# Random-weight CosyVoice2 built by Chorus's cosyvoice2_dummy_model command ({size}).
sample_rate: {sample_rate}
llm_input_size: {qwen_hidden}
llm_output_size: {qwen_hidden}
spk_embed_dim: {embedding_dim}
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2
chunk_size: 25
num_decoding_left_chunks: -1

llm: !new:cosyvoice.llm.llm.Qwen2LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: {speech_tokens}
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    input_size: 512
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: {speech_tokens}
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    encoder: !new:cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder
        output_size: 512
        attention_heads: {encoder_heads}
        linear_units: {encoder_units}
        num_blocks: {encoder_blocks}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: True
        input_layer: 'linear'
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        input_size: 512
        use_cnn_module: False
        macaron_style: False
        static_chunk_size: !ref <chunk_size>
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            in_channels: 320
            out_channels: 80
            channels: [{decoder_channels}]
            dropout: 0.0
            attention_head_dim: {decoder_head_dim}
            n_blocks: {decoder_blocks}
            num_mid_blocks: {decoder_mid_blocks}
            num_heads: {decoder_heads}
            act_fn: 'gelu'
            static_chunk_size: 50
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

hift: !new:cosyvoice.hifigan.generator.HiFTGenerator
    in_channels: 80
    base_channels: {hift_channels}
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: {hift_channels}

get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer
    token_path: !ref <qwen_pretrain_path>
    skip_special_tokens: True
allowed_special: 'all'
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: 8000
    center: False
"""


def build_dummy_model(
    out: Path,
    *,
    size: str = "tiny",
    stop: str = "capped",
    seed: int = 1986,
    src_dir: Path | None = None,
) -> Path:
    """Write a loadable CosyVoice2 folder with random weights to `out`; return it."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, not {size!r}")
    if stop not in STOPS:
        raise ValueError(f"stop must be one of {', '.join(STOPS)}, not {stop!r}")
    shape = SIZES[size]
    _put_upstream_on_path(src_dir)
    import torch

    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    qwen_dir = out / "CosyVoice-BlankEN"
    _write_qwen(qwen_dir, shape)
    yaml_text = _YAML.format(
        size=size,
        sample_rate=SAMPLE_RATE,
        embedding_dim=EMBEDDING_DIM,
        speech_tokens=SPEECH_TOKENS,
        **{name: getattr(shape, name) for name in shape.__dataclass_fields__},
    )
    (out / "cosyvoice2.yaml").write_text(yaml_text)
    _write_weights(out, qwen_dir, stop)
    _write_campplus(out / "campplus.onnx", seed)
    _write_speech_tokenizer(out / "speech_tokenizer_v2.onnx")
    torch.save({}, out / "spk2info.pt")
    (out / "chorus-dummy.json").write_text(json.dumps({"size": size, "stop": stop, "seed": seed}))
    return out


def _put_upstream_on_path(src_dir: Path | None) -> None:
    if src_dir is None:
        return
    for path in (src_dir / "third_party" / "Matcha-TTS", src_dir):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


def _write_qwen(folder: Path, shape: Shape) -> None:
    """Random Qwen2 weights and a small byte-level BPE, loadable with from_pretrained."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2TokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.bpe_vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    tokenizer: Any = Qwen2TokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    tokenizer.save_pretrained(folder)
    config = Qwen2Config(
        vocab_size=shape.qwen_vocab,
        hidden_size=shape.qwen_hidden,
        intermediate_size=shape.qwen_intermediate,
        num_hidden_layers=shape.qwen_layers,
        num_attention_heads=shape.qwen_heads,
        num_key_value_heads=shape.qwen_kv_heads,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    )
    model: Any = Qwen2ForCausalLM(config)
    model.save_pretrained(folder)


def _write_weights(out: Path, qwen_dir: Path, stop: str) -> None:
    """llm.pt, flow.pt and hift.pt from the modules the yaml builds (so strict loads pass)."""
    import torch
    from hyperpyyaml import load_hyperpyyaml

    with (out / "cosyvoice2.yaml").open() as handle:
        configs: dict[str, Any] = load_hyperpyyaml(
            handle, overrides={"qwen_pretrain_path": str(qwen_dir)}
        )
    llm = configs["llm"]
    with torch.no_grad():
        # The decoder's last three outputs are upstream's stop tokens.
        llm.llm_decoder.bias[SPEECH_TOKENS:] = _STOP_BIAS[stop]
    torch.save(llm.state_dict(), out / "llm.pt")
    torch.save(configs["flow"].state_dict(), out / "flow.pt")
    torch.save(configs["hift"].state_dict(), out / "hift.pt")


def _write_campplus(path: Path, seed: int) -> None:
    """Speaker embedding: (1, T, 80) fbank -> (1, 192), a mean and a random projection."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(seed).standard_normal((80, EMBEDDING_DIM)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["feats"], ["pooled"], axes=[1], keepdims=0),
            helper.make_node("MatMul", ["pooled", "projection"], ["embedding"]),
        ],
        "campplus",
        [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, "T", 80])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, EMBEDDING_DIM])],
        [numpy_helper.from_array(weights, "projection")],
    )
    onnx.save(_model(graph), str(path))


def _write_speech_tokenizer(path: Path) -> None:
    """Speech tokens: (1, 128, F) log-mel + length -> (1, ceil(F/4)) int64 in [0, 6561)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def const(name: str, values: list[int] | list[float], dtype: Any) -> Any:
        return numpy_helper.from_array(np.array(values, dtype=dtype), name)

    graph = helper.make_graph(
        [
            # Four mel frames per token (25 tokens/s at whisper's 100 frames/s).
            helper.make_node("ReduceMean", ["feats"], ["frames"], axes=[1], keepdims=0),
            helper.make_node("Slice", ["frames", "start", "end", "axis", "step"], ["picked"]),
            helper.make_node("Abs", ["picked"], ["magnitude"]),
            helper.make_node("Mul", ["magnitude", "scale"], ["scaled"]),
            helper.make_node("Cast", ["scaled"], ["whole"], to=TensorProto.INT64),
            helper.make_node("Mod", ["whole", "vocabulary"], ["tokens"]),
        ],
        "speech_tokenizer_v2",
        [
            helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "F"]),
            helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1]),
        ],
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, "N"])],
        [
            const("start", [0], np.int64),
            const("end", [2**62], np.int64),
            const("axis", [1], np.int64),
            const("step", [4], np.int64),
            const("scale", [7919.0], np.float32),
            const("vocabulary", [SPEECH_TOKENS], np.int64),
        ],
    )
    onnx.save(_model(graph), str(path))


def _model(graph: Any) -> Any:
    from onnx import checker, helper

    # Opset 17 keeps ReduceMean's axes as an attribute; IR 8 loads in any recent runtime.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    checker.check_model(model)
    return model
