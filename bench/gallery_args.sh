# gallery_args.sh -- sourced by bench/ab_check.sh and bench/bwd_passes.sh:
# the `flexgen check` arguments of a gallery mod at the benchmark shape
# (B=4 H=16 S=8192), the buffers of the mods that read one included.

# gallery_buffers DIR: the buffer files, written to DIR. ALiBi's slopes
# (2^(-8 (h + 1) / 16), 16 heads); document's ids (documents of 1000
# tokens); flamingo's: text in nine even intervals, interval i seeing
# image i - 1 (the first none), and eight images of 1024 tokens each.
gallery_buffers() {
    awk 'BEGIN { for (h = 0; h < 16; h++) print 2 ^ (-8 * (h + 1) / 16) }' >"$1/slopes.txt"
    awk 'BEGIN { for (t = 0; t < 8192; t++) print int(t / 1000) }' >"$1/document_id.txt"
    awk 'BEGIN { for (t = 0; t < 8192; t++) print int(t * 9 / 8192) - 1 }' >"$1/text_image.txt"
    awk 'BEGIN { for (t = 0; t < 8192; t++) print int(t / 1024) }' >"$1/kv_image.txt"
}

# gallery_mod_args ROOT DIR MOD: MOD's mask_mod from ROOT/mods (with its
# score_mod when the file has one; noop: its score_mod, no block mask) and
# its buffers from DIR (gallery_buffers).
gallery_mod_args() {
    local f=$1/mods/$3.c
    if [ "$3" = noop ]; then echo "--score $f"; return; fi
    echo "--mask $f --block-mask"
    if grep -q "float score_mod" "$f"; then echo "--score $f"; fi
    case $3 in
    alibi) echo "--buffer slopes=$2/slopes.txt" ;;
    document) echo "--buffer document_id=$2/document_id.txt" ;;
    flamingo) echo "--buffer text_image=$2/text_image.txt --buffer kv_image=$2/kv_image.txt" ;;
    esac
}
