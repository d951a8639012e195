# Run once, at 17:24 on 2026-11-30: step times of three builds in turn (old = /work/main at c4294df,
# new = this branch before and after the M = 1 change, which FD_M1_256 then switched on).
cd /work/kernel-wt
uptime
for round in 1 2 3; do
  for cfg in old new new256; do
    case $cfg in
      old) dir=/work/main; extra="";;
      new) dir=/work/kernel-wt; extra="";;
      new256) dir=/work/kernel-wt; extra="FD_M1_256=1";;
    esac
    r=$(env $extra SPLIT=0 FASTDECODE_NO_PACKAGE=1 PYTHONPATH=$dir/src /work/main/.venv/bin/python benchmarks/quant_small_m/profile_step.py 1,5,8 300 2>/dev/null | grep "^T=" | awk '{print $1, $3}' | tr '\n' ' ')
    echo "round $round $cfg: $r"
  done
done
uptime
