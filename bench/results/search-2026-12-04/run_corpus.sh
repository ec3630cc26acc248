#!/bin/bash
# usage: run_corpus.sh TREE OUTDIR
TREE=$1; OUT=$2; mkdir -p $OUT
cd $TREE
export PYTHONPATH=$TREE
python -c "import planner; print('planner from', planner.__file__)"
while read spec b25 b50 b75; do
  name=$(basename $spec .yaml)
  for share in 25 50 75; do
    eval B=\$b$share
    for w in decode decode=32 prefill; do
      wn=${w/=/}
      f=$OUT/$name-$share-$wn.yaml
      python -m planner.cli plan $spec --gpu-budget $B --workload $w -o $f > $OUT/$name-$share-$wn.log 2>&1
      echo "$name $share $wn rc=$?"
    done
  done
done <<'LIST'
examples/generated/deepseek-v2-lite.yaml 7854946048 15709892096 23564838144
examples/generated/mixtral-8x7b.yaml 23351396352 46702792704 70054189056
examples/generated/qwen3-30b-a3b.yaml 15266061312 30532122624 45798183936
LIST
