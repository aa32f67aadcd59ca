// Package fsutil holds the file operations that the bench harness and the e2e module share.
package fsutil

import (
	"io"
	"os"
)

// CopyFile copies src (following links) to dst, created or truncated with mode. A failed copy
// reports the first error; dst may then hold part of src.
func CopyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
