package goharness

import (
	"os"
	"strconv"
	"strings"
)

// Tree is pid followed by all its descendants, read from /proc.
func Tree(pid int) []int {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := StatFieldsOf(n)
		if err != nil || len(f) < 2 {
			continue
		}
		pp, _ := strconv.Atoi(f[1])
		children[pp] = append(children[pp], n)
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// StatFields are the fields of /proc/<pid>/stat after the command name
// (index 0 = state, 1 = ppid, …, 11 = utime, 12 = stime).
func StatFields(s string) []string {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

// StatFieldsOf is StatFields of /proc/<pid>/stat.
func StatFieldsOf(pid int) ([]string, error) {
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	return StatFields(string(st)), nil
}
