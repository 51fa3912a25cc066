package main

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// row is one line of the results table: ours against one anchor.
type row struct {
	id, workload string
	unit         string
	lowerBetter  bool
	anchorName   string
	ours, anchor []float64
	// CPU seconds per GiB moved (<0: not applicable) and peak RSS in KiB
	// (0: not measured), of the proxy processes only.
	cpuOurs, cpuAnchor float64
	rssOurs, rssAnchor int64
	// aim on the ratio ours/anchor (ratioMin: at least, ratioMax: at most),
	// or on ours alone (oursMin).
	aim                                  string
	ratioMin, ratioMax, oursMin, oursMax float64
	// oursZero: the aim is ours exactly 0 (a count of failures).
	oursZero bool
	// aimFor: the aim applies to the row against this anchor only.
	aimFor string
	// CPU aims (issue 18.2), checked besides the aim above: ours / anchor
	// CPU per GiB at most cpuRatioMax, ours CPU per GiB at most cpuMax,
	// ours CPU per operation (rate rows) at most opMaxMicros.
	cpuAim                           string
	cpuRatioMax, cpuMax, opMaxMicros float64
	// CPU per operation in µs (rate rows; 0: not measured).
	opOurs, opAnchor float64
	// perOp: bytes one operation of a rate workload moves; the note then
	// gives CPU time per operation.
	perOp int64
	note  string
	err   string
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func minMax(v []float64) (float64, float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, x := range v {
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	return lo, hi
}

func (r *row) ratio() float64 {
	a := median(r.anchor)
	if len(r.anchor) == 0 || a == 0 || math.IsNaN(a) {
		return math.NaN()
	}
	return median(r.ours) / a
}

func (r *row) cpuRatio() float64 {
	if r.cpuOurs < 0 || r.cpuAnchor <= 0 {
		return math.NaN()
	}
	return r.cpuOurs / r.cpuAnchor
}

// aims is the Aim column: the throughput/latency aim and the CPU aim.
func (r *row) aims() string {
	var a []string
	for _, x := range []string{r.aim, r.cpuAim} {
		if x != "" {
			a = append(a, x)
		}
	}
	return strings.Join(a, "; ")
}

// met is the Met column: "yes", "no" or "" (no aim) per aim, in the order
// of aims().
func (r *row) met() string {
	var m []string
	if r.aim != "" {
		m = append(m, r.metAim())
	}
	if r.cpuAim != "" {
		m = append(m, r.metCPU())
	}
	return strings.Join(m, "; ")
}

func (r *row) metCPU() string {
	if r.err != "" {
		return "no"
	}
	ok := true
	if r.cpuRatioMax > 0 {
		q := r.cpuRatio()
		ok = ok && !math.IsNaN(q) && q <= r.cpuRatioMax
	}
	if r.cpuMax > 0 {
		ok = ok && r.cpuOurs >= 0 && r.cpuOurs <= r.cpuMax
	}
	if r.opMaxMicros > 0 {
		ok = ok && r.opOurs > 0 && r.opOurs <= r.opMaxMicros
	}
	if ok {
		return "yes"
	}
	return "no"
}

func (r *row) metAim() string {
	if r.err != "" {
		return "no"
	}
	switch {
	case r.oursZero:
		if len(r.ours) > 0 && median(r.ours) == 0 {
			return "yes"
		}
		return "no"
	case r.ratioMin > 0:
		if q := r.ratio(); !math.IsNaN(q) && q >= r.ratioMin {
			return "yes"
		}
		return "no"
	case r.ratioMax > 0:
		if q := r.ratio(); !math.IsNaN(q) && q <= r.ratioMax {
			return "yes"
		}
		return "no"
	case r.oursMin > 0:
		if median(r.ours) >= r.oursMin {
			return "yes"
		}
		return "no"
	case r.oursMax > 0:
		if median(r.ours) <= r.oursMax {
			return "yes"
		}
		return "no"
	}
	return ""
}

func num(x float64) string {
	switch {
	case math.IsNaN(x) || math.IsInf(x, 0):
		return "–"
	case x == 0:
		return "0"
	case math.Abs(x) >= 100:
		return fmt.Sprintf("%.0f", x)
	case math.Abs(x) >= 10:
		return fmt.Sprintf("%.1f", x)
	case math.Abs(x) >= 1:
		return fmt.Sprintf("%.2f", x)
	default:
		return fmt.Sprintf("%.3f", x)
	}
}

func spread(v []float64) string {
	if len(v) == 0 {
		return "–"
	}
	lo, hi := minMax(v)
	return fmt.Sprintf("%s / %s / %s", num(lo), num(median(v)), num(hi))
}

func mibStr(kib int64) string {
	if kib <= 0 {
		return "–"
	}
	return num(float64(kib) / 1024)
}

func cpuStr(x float64) string {
	if x < 0 {
		return "–"
	}
	return num(x)
}

func renderTable(rows []*row) string {
	var b strings.Builder
	b.WriteString("| ID | Workload | Ours | Anchor | Ratio | Aim | Met | Ours min / med / max | Anchor min / med / max | CPU s/GiB ours / anchor = ratio | Peak RSS MiB ours / anchor |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		ours := num(median(r.ours)) + " " + r.unit
		anchor := "–"
		if r.anchorName != "" {
			anchor = r.anchorName + ": " + num(median(r.anchor)) + " " + r.unit
		}
		ratio := num(r.ratio())
		if ratio != "–" {
			ratio += "×"
		}
		if r.err != "" {
			ours = "error"
		}
		wl := r.workload
		if r.note != "" {
			wl += " (" + r.note + ")"
		}
		if r.err != "" {
			wl += " — error: " + strings.ReplaceAll(r.err, "\n", " ")
		}
		cpu := cpuStr(r.cpuOurs) + " / " + cpuStr(r.cpuAnchor)
		if q := r.cpuRatio(); !math.IsNaN(q) {
			cpu += " = " + num(q) + "×"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s / %s |\n",
			r.id, strings.ReplaceAll(wl, "|", "/"), ours, anchor, ratio, r.aims(), r.met(), spread(r.ours), spread(r.anchor),
			cpu, mibStr(r.rssOurs), mibStr(r.rssAnchor))
	}
	return b.String()
}
