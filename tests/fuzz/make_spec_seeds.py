#!/usr/bin/env python3
"""Writes the spec harness's seed corpus (tests/fuzz/seeds/spec/): one JSON
document per compile of the small samples ({"model", "from", "to", "cluster",
"strategy"}) and of small quantized layouts (the compiler's quant tests)."""
import json
import os
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests", "fuzz", "seeds", "spec")
os.makedirs(out, exist_ok=True)


def load(path):
    with open(os.path.join(root, path)) as f:
        return json.load(f)


tiny_cluster = {"format": "reshard.cluster/1", "name": "test", "gpus_per_domain": 8, "nic_gbps": 400,
                "nvlink_GBps": 450}


def write(name, model, src, dst, cluster=tiny_cluster, strategy="direct"):
    doc = {"model": model, "from": src, "to": dst, "cluster": cluster, "strategy": strategy}
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))


# The small samples only (a seed must compile, validate and replay in well
# under a second under the sanitizers; tiny-moe takes 10 s).
for sample, infers in (("tiny-dense", ("infer", "infer-tp2-dp2", "infer-tp1-dp4")),):
    model = load(f"samples/{sample}/model.json")
    train = load(f"samples/{sample}/train.json")
    for infer in infers:
        for strategy in ("direct", "gather"):
            write(f"{sample}-{infer}-{strategy}", model, train, load(f"samples/{sample}/{infer}.json"),
                  load("samples/clusters/dgx-h100.json"), strategy)

# The compiler's quant tests: gate/up/down/norm, TP2 -> TP2 with FP8 buffers.
qmodel = {"format": "reshard.model/1", "name": "q", "dtype": "bf16", "dims": {"layer": 2},
          "tensors": [{"name": "layers.{layer}.gate", "shape": [8, 12]},
                      {"name": "layers.{layer}.up", "shape": [8, 12]},
                      {"name": "layers.{layer}.down", "shape": [12, 8]},
                      {"name": "layers.{layer}.norm", "shape": [12]}]}
qtrain = {"format": "reshard.layout/1", "name": "train", "ranks": 2, "meshes": {"dense": [["tp", 2]]},
          "placements": [{"match": "*", "mesh": "dense"}]}


def qinfer(quant):
    quant = dict(quant, scale_name="layers.{layer}.gate_up_scale")
    return {"format": "reshard.layout/1", "name": "infer", "ranks": 2, "default_buffers": True,
            "meshes": {"dense": [["tp", 2]]},
            "placements": [{"match": "layers.{layer}.down", "tp": {"shard": 1}}, {"match": "layers.{layer}.norm"},
                           {"match": "*", "tp": {"shard": 0}}],
            "buffers": [{"name": "layers.{layer}.gate_up", "parts": ["layers.{layer}.gate", "layers.{layer}.up"],
                         "concat": 0, "quant": quant},
                        {"name": "layers.{layer}.down", "tensor": "layers.{layer}.down"}]}


for name, quant in (("block-2x8", {"format": "fp8_e4m3", "scale": "block", "block": [2, 8]}),
                    ("block-8x8", {"format": "fp8_e4m3", "scale": "block", "block": [8, 8]}),
                    ("channel", {"format": "fp8_e4m3", "scale": "channel"}),
                    ("tensor", {"format": "fp8_e4m3", "scale": "tensor"}),
                    ("mxfp8", {"format": "mxfp8"})):
    write(f"quant-{name}", qmodel, qtrain, qinfer(quant))
    write(f"quant-{name}-from-fp8", qmodel, qinfer(quant), qtrain)

# The regression corpus (tests/fuzz/regressions/spec/): the spec inputs of
# issue 17, each a document the harness must refuse cleanly.
reg = os.path.join(root, "tests", "fuzz", "regressions", "spec")
os.makedirs(reg, exist_ok=True)
base = {"model": load("samples/tiny-dense/model.json"), "from": load("samples/tiny-dense/train.json"),
        "to": load("samples/tiny-dense/infer.json"), "cluster": tiny_cluster, "strategy": "direct"}
text = json.dumps(base, separators=(",", ":"))


def regression(name, doc_text):
    with open(os.path.join(reg, name), "w") as f:
        f.write(doc_text)


regression("ranks-1e9", text.replace('"ranks":8', '"ranks":1e9', 1))
regression("ranks-1000000000", text.replace('"ranks":8', '"ranks":1000000000', 1))
regression("nic-gbps-1e400", text.replace('"nic_gbps":400', '"nic_gbps":1e400', 1))
regression("shape-2-64-minus-1", text.replace('"shape":[', '"shape":[18446744073709551615,', 1))
regression("syntax-error-minified-raw-bytes", text[:len(text) // 2] + "\x01\x7f\xff" + text[len(text) // 2:])
regression("duplicate-key", text.replace('"name":', '"name":"x","name":', 1))
overflow = json.loads(text)
overflow["from"]["meshes"] = {"m": [["a", 1048576], ["b", 1048576], ["c", 1048576], ["d", 1048576]]}
regression("mesh-product-overflow", json.dumps(overflow, separators=(",", ":")))
# (A model of 10^4 tensors, the timing input, compiles in minutes under
# ASan: too slow for CI's regression run; the compile-time item is open.)
