package fencing

import (
	"strconv"
	"strings"
)

// ParseFence parses a fencing token as written in an annotation: a decimal
// int64 of at least 1, no sign, no spaces, no leading zeros. Anything else
// is refused with ReasonNoFence, so that "007", "+7" and "7 " can never be
// read as the token 7 by one enforcement point and refused by another.
func ParseFence(s string) (int64, error) {
	if s == "" {
		return 0, refuse(ReasonNoFence, "the write carries no fence")
	}
	if s[0] < '1' || s[0] > '9' || strings.TrimLeft(s, "0123456789") != "" {
		return 0, refuse(ReasonNoFence, "fence %q is not a positive decimal integer", s)
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, refuse(ReasonNoFence, "fence %q does not fit in an int64", s)
	}
	return v, nil
}

// FormatFence is the inverse of ParseFence.
func FormatFence(f int64) string { return strconv.FormatInt(f, 10) }
