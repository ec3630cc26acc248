#!/bin/sh
# plan-diff.sh BASE [HEAD]: a markdown review of what a change does to the committed offload plans.
#
# For every plan that planner-plans.sh makes (one `planner plan SPEC [options] -o PLAN` a line;
# README, "Plans in review"), the plan is made again from HEAD's specs in a scratch worktree and
# compared with the plan committed at BASE: `planner diff OLD NEW --format markdown` (a rank set, a
# `--tp N` line's folder, rank by rank). Run it from
# the repository root; the working tree is left as it is. Markdown on stdout; exit 0 when it
# could be made (whether or not a plan changed); otherwise the planner's exit code (a plan that
# cannot be made: its message on stderr; one that cannot be compared: its message in the markdown).
#
#   examples/review/plan-diff.sh origin/main              # this branch's commit against main
#   examples/review/plan-diff.sh HEAD~1 HEAD > plan-diff.md
#
# PLANNER_MANIFEST names another manifest (a path from the repository root).
set -eu

base=${1:?usage: plan-diff.sh BASE [HEAD]}
head=${2:-HEAD}
manifest=${PLANNER_MANIFEST:-planner-plans.sh}

scratch=$(mktemp -d)
worktree="$scratch/head"
cleanup() {
    git worktree remove --force "$worktree" >/dev/null 2>&1 || true
    rm -rf "$scratch"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

git rev-parse --verify --quiet "$base^{commit}" >/dev/null || { echo "plan-diff.sh: no commit $base" >&2; exit 2; }
git worktree add --detach --quiet "$worktree" "$head"

# The manifest is checked first (one plain `planner plan` command a line), then run by sh.
plans=$(cd "$worktree" && planner check-plans --manifest "$manifest" --list)
folder=$(dirname "$manifest")
(cd "$worktree/$folder" && sh -e "$(basename "$manifest")")

echo "## Offload plans: \`$base\` → \`$head\`"
printf '%s\n' "$plans" > "$scratch/plans"
unchanged=""
failed=0
while IFS= read -r plan; do
    plan=${plan#./}
    plan=${plan%/}
    # the plan as committed at BASE: a file, or a folder of rank plans (--tp N), compared rank by rank
    rm -rf "$scratch/base" && mkdir "$scratch/base"
    if ! git archive --format=tar "$base" -- "$plan" 2>/dev/null | tar -xf - -C "$scratch/base" 2>/dev/null \
            || ! [ -e "$scratch/base/$plan" ]; then
        printf '\n### `%s`\n\nA new plan (not in `%s`).\n' "$plan" "$base"
        continue
    fi
    status=0
    planner diff "$scratch/base/$plan" "$worktree/$plan" --format markdown > "$scratch/diff.md" 2>&1 || status=$?
    case $status in
        0) unchanged="$unchanged \`$plan\`" ;;
        1) echo  # planner diff's title becomes the plan's, its sections one level down
           awk -v plan="$plan" 'NR == 1 && /^## / { print "### `" plan "`"; next } /^#/ { print "#" $0; next } { print }' \
               "$scratch/diff.md" ;;
        *) printf '\n### `%s`\n\nNot compared:\n\n```text\n' "$plan"; cat "$scratch/diff.md"; printf '```\n'
           failed=$status ;;
    esac
done < "$scratch/plans"
if [ -n "$unchanged" ]; then
    printf '\nUnchanged:%s\n' "$unchanged"
fi
exit "$failed"
