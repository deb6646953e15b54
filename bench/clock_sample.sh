# clock_sample.sh -- sourced by bench/ab_check.sh: the board's power and SM
# clock while one timed command runs, so that an A/B line shows the clock
# it ran at (every flexgen forward runs at the board's power cap under
# sustained load, and a change can move the clock as well as the cycles:
# bench/attention_notes.md, "Power under sustained load, measured again").
#
# clock_start FILE   nvidia-smi samples the board power and clocks.sm into
#                    FILE every 50 ms (GPU $CLOCK_GPU, default 0, in
#                    nvidia-smi's numbering); nothing without nvidia-smi.
#                    The power is power.draw.instant where the driver has
#                    it: its power.draw is a one-second mean there, which
#                    in a one-second sustained run takes in the idle time
#                    before it (ab_check's W read ~460 W on kernels at the
#                    cap's clocks).
# clock_stop         ends the sampling
# clock_summary FILE "(W W, MHz MHz)": the means over the samples drawing
#                    more than 250 W (a busy H100 or H200), the first ten
#                    (half a second of ramp) left out; nothing with fewer
#                    than five left (a run without --sustain-ms is too
#                    short to read)
clock_pid=
clock_power= # the power field, asked of the driver once
clock_start() {
    clock_pid=
    command -v nvidia-smi >/dev/null 2>&1 || return 0
    if [ -z "$clock_power" ]; then
        clock_power=power.draw
        nvidia-smi -i "${CLOCK_GPU:-0}" --query-gpu=power.draw.instant --format=csv,noheader,nounits 2>/dev/null |
            grep -q '^[0-9]' && clock_power=power.draw.instant
    fi
    nvidia-smi -i "${CLOCK_GPU:-0}" --query-gpu="$clock_power",clocks.sm --format=csv,noheader,nounits \
        -lms 50 >"$1" 2>/dev/null &
    clock_pid=$!
}
clock_stop() {
    [ -n "$clock_pid" ] || return 0
    kill "$clock_pid" 2>/dev/null
    wait "$clock_pid" 2>/dev/null
    clock_pid=
}
clock_summary() {
    [ -s "$1" ] || return 0
    awk -F', *' '$1 + 0 > 250 { n++; if (n > 10) { p += $1; c += $2; m++ } }
        END { if (m >= 5) printf "(%.0f W, %.0f MHz)", p / m, c / m }' "$1"
}
