# Shared by the prepared GPU commands that run `posenc extend` on the GPU machine, whose python3 has torch and
# Triton but not posenc's other dependencies, and which reaches no network. Two things travel with the checkout:
# - Wheels (WHEELS, default ./.whl, an ignored folder named in the device call's carry): every *.whl in it goes at
#   the END of PYTHONPATH, so what the machine has installed wins and a pure-Python wheel (omegaconf, antlr4 4.9.3,
#   gguf, PyYAML's pure-Python half) is imported straight from its zip. Fill it once here:
#     pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .whl \
#       omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 gguf==0.19.0 pyyaml==6.0.2
# - A model file larger than one call carries (64 MiB, the checkout included): gzip pieces, one carried per call
#   while the machine stays warm, joined by `join_pieces` and checked against the SHA-256 its package states.
#     gzip -c FILE | split -b 59500000 -d -a 1 - DIR/p
wheels_on_path() {  # wheels_on_path [DIR]: append every wheel in DIR to PYTHONPATH
  local dir=${1:-${WHEELS:-$PWD/.whl}} wheel
  for wheel in "$dir"/*.whl; do [ -e "$wheel" ] && PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$wheel"; done
  export PYTHONPATH
}
join_pieces() {  # join_pieces PIECES_DIR FILE SHA256: gunzip the pieces into FILE; exit 2 if its SHA-256 differs
  cat "$1"/p? | gunzip > "$2"
  local got; got=$(sha256sum "$2" | cut -d' ' -f1)
  if [ "$got" != "$3" ]; then echo "PIECES=$1: joined file's SHA-256 is $got, not $3"; exit 2; fi
}
