#!/usr/bin/mawk -f
# Baseline for bench_parse.py: caller->callee aggregation of function_graph text
# (default layout: " CPU) [mark] duration us |  body") with one brace stack per CPU,
# written the way an engineer would in awk (whitespace fields, no regexes per line).
# Prints: caller<TAB>callee<TAB>calls<TAB>total_us, one edge a line.
/^#/ { next }
{
    if ($2 == "|") { f = 3; dur = 0 }
    else if ($4 == "us") { f = 6; dur = $3 + 0 }
    else if ($3 == "us") { f = 5; dur = $2 + 0 }
    else next
    cpu = $1
    tok = $f
    if (tok == "}") {
        d = sp[cpu]
        if (d > 0) {
            callee = st[cpu, d]
            sp[cpu] = d - 1
            caller = (d > 1) ? st[cpu, d - 1] : "-"
            total[caller SUBSEP callee] += dur
        }
        next
    }
    q = index(tok, "(")
    name = q ? substr(tok, 1, q - 1) : tok
    d = sp[cpu]
    caller = (d > 0) ? st[cpu, d] : "-"
    calls[caller SUBSEP name]++
    if ($NF == "{") {
        sp[cpu] = d + 1
        st[cpu, d + 1] = name
    } else {
        total[caller SUBSEP name] += dur
    }
}
END {
    for (k in calls) {
        split(k, e, SUBSEP)
        printf "%s\t%s\t%d\t%.3f\n", e[1], e[2], calls[k], total[k]
    }
}
