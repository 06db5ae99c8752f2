package chart

import (
	"os"

	"gonum.org/v1/plot/vg/vgimg"
)

// savePNG writes c to path, closing the file whatever happens.
func savePNG(path string, c vgimg.PngCanvas) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
