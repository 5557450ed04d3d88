# source me: this worktree's code first (the shared venv's editable install points at /work/main)
export PYTHONPATH=/work/wt/s5-int/src:/work/wt/s5-int/local
export PATH=/work/wt/s5-int/.venv/bin:$PATH
cd /work/wt/s5-int
