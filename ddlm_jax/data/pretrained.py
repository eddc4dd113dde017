"""Pretrained subword tokenizers (BERT, GPT-2) and their test-only stand-ins.

The paper recipes tokenize LM1B with ``bert-base-uncased`` and OpenWebText
with ``gpt2``. ``load_hf_tokenizer`` finds such a tokenizer, in order:

1. a path: a ``tokenizer.json`` file, a folder holding one, or a folder with a
   ``ddlm_tokenizer.json`` saved by a run;
2. the local Hugging Face cache (``huggingface_hub`` with
   ``local_files_only=True``, then ``transformers.AutoTokenizer`` for repos
   without a ``tokenizer.json``); nothing is downloaded in this step;
3. the Hub itself, unless ``HF_HUB_OFFLINE=1`` or ``allow_download=False``.

If all fail, ``DataUnavailableError`` names the command that caches it.

``build_test_tokenizer`` trains a small tokenizer on local text instead:
``'test:wordpiece'`` imitates BERT (lower-cased WordPiece with ``[PAD]``,
``[UNK]``, ``[CLS]``, ``[SEP]``, ``[MASK]``) and ``'test:bytebpe'`` imitates
GPT-2 (byte-level BPE with ``<|endoftext|>``). THEY EXIST FOR OFFLINE TESTS
AND SMOKE PRESETS ONLY: numbers measured with them are not comparable to any
paper.

Every tokenizer here is a ``tokenizers.BPETokenizer`` (kind ``'bpe'``, the
suite's wrapper of any HF ``tokenizers`` model, also named ``HFTokenizer``
here), so ``tokenizers.load_tokenizer`` reloads it from a run directory; it
has ``encode_batch`` (the Rust tokenizer's multi-threaded batch encoding)
and ``special_ids``. Encoding never adds special tokens; the data sources
add BOS/EOS/PAD themselves.
"""

from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Sequence

from ddlm_jax.data import tokenizers as tok_lib

TEST_TOKENIZERS = ('test:wordpiece', 'test:bytebpe')

SpecialIds = tok_lib.SpecialIds
# The HF tokenizer class; the name stays for callers that check for it.
HFTokenizer = tok_lib.BPETokenizer


class DataUnavailableError(FileNotFoundError):
  """A dataset, token cache or tokenizer is missing; says how to get it."""


def subword_tokenizer(tokenizer: tok_lib.Tokenizer, what: str) -> HFTokenizer:
  """``tokenizer`` if it is an HF tokenizer (a run's saved one), else raises.

  A run directory may hold a tokenizer of another kind (a char or text8
  run); the subword datasets cannot use it.
  """
  if not isinstance(tokenizer, HFTokenizer):
    raise ValueError(
      f'{what} needs a subword (HF) tokenizer, got {tokenizer!r}; a run '
      'directory saved with another kind cannot be reused (fresh workdir).'
    )
  return tokenizer


def _cache_command(name: str) -> str:
  return (
    'python -c "from huggingface_hub import hf_hub_download; '
    f"hf_hub_download('{name}', 'tokenizer.json')\""
  )


def _from_path(path: pathlib.Path) -> HFTokenizer:
  from tokenizers import Tokenizer

  if path.is_dir():
    saved = path / tok_lib.TOKENIZER_FILENAME
    if saved.is_file():
      return subword_tokenizer(tok_lib.load_tokenizer(path), str(path))
    path = path / 'tokenizer.json'
  if not path.is_file():
    raise DataUnavailableError(f'No tokenizer.json at {path}.')
  return HFTokenizer(Tokenizer.from_file(str(path)))


def _from_cache(name: str) -> HFTokenizer | None:
  from tokenizers import Tokenizer

  try:
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(name, 'tokenizer.json', local_files_only=True)
    return HFTokenizer(Tokenizer.from_file(path))
  except Exception:  # noqa: BLE001 - not cached, or no tokenizer.json.
    pass
  try:
    import transformers

    auto = transformers.AutoTokenizer.from_pretrained(
      name, local_files_only=True
    )
    return HFTokenizer(auto.backend_tokenizer)
  except Exception:  # noqa: BLE001 - not cached / transformers missing.
    return None


def load_hf_tokenizer(
  name: str, *, allow_download: bool | None = None
) -> HFTokenizer:
  """Loads a pretrained tokenizer by path or Hub name (module docstring).

  Args:
    name: a path (tokenizer.json or a folder) or a Hub id such as
      ``'bert-base-uncased'`` or ``'gpt2'``.
    allow_download: reach the Hub when the cache lacks it; default: unless
      the environment sets ``HF_HUB_OFFLINE=1``.

  Raises:
    DataUnavailableError: not found; the message gives the caching command.
  """
  if not name:
    raise ValueError(
      'No tokenizer named: set --config.data.hf_tokenizer (e.g. gpt2, '
      f'bert-base-uncased, a tokenizer.json path, or one of {TEST_TOKENIZERS} '
      'for offline tests).'
    )
  path = pathlib.Path(os.path.expanduser(name))
  if path.exists():
    return _from_path(path)
  cached = _from_cache(name)
  if cached is not None:
    return cached
  if allow_download is None:
    allow_download = os.environ.get('HF_HUB_OFFLINE', '0') in ('0', '')
  if allow_download:
    try:
      from huggingface_hub import hf_hub_download
      from tokenizers import Tokenizer

      return HFTokenizer(
        Tokenizer.from_file(hf_hub_download(name, 'tokenizer.json'))
      )
    except Exception as e:  # noqa: BLE001
      detail = f' (download failed: {type(e).__name__}: {e})'
  else:
    detail = ' (downloads disabled: HF_HUB_OFFLINE=1)'
  raise DataUnavailableError(
    f'Tokenizer {name!r} is not in the Hugging Face cache{detail}. On a '
    f'machine with internet, cache it with:\n  {_cache_command(name)}\n'
    'or copy its tokenizer.json here and set '
    '--config.data.hf_tokenizer=/path/to/tokenizer.json.'
  )


def build_test_tokenizer(
  kind: str, texts: Sequence[str], vocab_size: int
) -> HFTokenizer:
  """Trains a small TEST-ONLY stand-in for BERT or GPT-2 on local text.

  Args:
    kind: 'test:wordpiece' (BERT-like) or 'test:bytebpe' (GPT-2-like).
    texts: training documents (a few thousand words are plenty).
    vocab_size: target vocabulary size, specials included.
  """
  from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
  )

  if kind not in TEST_TOKENIZERS:
    raise ValueError(
      f'test tokenizer {kind!r}; choose one of {TEST_TOKENIZERS}.'
    )
  if not texts:
    raise ValueError('build_test_tokenizer needs some training text.')
  print(
    f'WARNING: building the TEST-ONLY tokenizer {kind!r} from local data; '
    'results are not comparable to the papers.',
    file=sys.stderr,
    flush=True,
  )
  if kind == 'test:wordpiece':
    specials = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
    hf = Tokenizer(models.WordPiece(unk_token='[UNK]'))
    hf.normalizer = normalizers.BertNormalizer(lowercase=True)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
      vocab_size=vocab_size, special_tokens=specials, show_progress=False
    )
  else:
    specials = ['<|endoftext|>']
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
      vocab_size=max(vocab_size, 257),
      special_tokens=specials,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False,
    )
  hf.train_from_iterator(list(texts), trainer=trainer)
  return HFTokenizer(hf)


__all__ = [
  'TEST_TOKENIZERS',
  'DataUnavailableError',
  'HFTokenizer',
  'SpecialIds',
  'build_test_tokenizer',
  'load_hf_tokenizer',
  'subword_tokenizer',
]
