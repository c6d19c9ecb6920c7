# Reads the weights section of a torchcompile package with Python's torch.load, as
# docs/deploying.md shows, and checks it against the manifest's list of weights.
#   python3 read_package_weights.py model.tcpkg
import io
import re
import sys

import torch

data = open(sys.argv[1], "rb").read()
at = data.index(b"\nsection weights ") + 1
name, length, checksum = data[at:data.index(b"\n", at)].split()[1:]
start = data.index(b"\n", at) + 1
weights = torch.load(io.BytesIO(data[start:start + int(length)]))

m = data.index(b"section manifest ")
m_len = int(data[m:data.index(b"\n", m)].split()[2])
m_start = data.index(b"\n", m) + 1
manifest = data[m_start:m_start + m_len].decode()
count = int(re.search(r"^weights (\d+)$", manifest, re.M).group(1))
names = re.findall(r'^"([^"]*)" (?:parameter|buffer|constant)$', manifest, re.M)
assert len(names) == count, (names, count)
assert sorted(weights.keys()) == sorted(names), (sorted(weights.keys()), sorted(names))
assert all(isinstance(t, torch.Tensor) for t in weights.values())
print("torch.load read %d weights: %s" % (len(weights), ", ".join(sorted(weights.keys()))))
