package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"strconv"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// A small line plotter for the bench's samples (bench --scale --plot): panels stacked, each
// with its own y axis from 0, one line per series, a shared x axis. The text is drawn with
// golang.org/x/image's fixed 7x13 font (docs/architecture.md says why).

type series struct {
	name   string
	color  color.RGBA
	xs, ys []float64
}

type panel struct {
	title  string
	series []series
}

const (
	plotWidth   = 1100
	panelHeight = 190
	plotLeft    = 80 // room for the y labels
	plotRight   = 20
	plotTop     = 40 // room for the title and the legend
	panelGap    = 30 // room for each panel's title
	plotBottom  = 40 // room for the x labels
)

var (
	plotInk  = color.RGBA{0x20, 0x20, 0x20, 0xff}
	plotGrid = color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
)

// plotPNG draws panels into a PNG file at path.
func plotPNG(path, title, xLabel string, panels []panel) error {
	h := plotTop + len(panels)*(panelHeight+panelGap) + plotBottom
	img := image.NewRGBA(image.Rect(0, 0, plotWidth, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	text(img, plotLeft, 16, title, plotInk)
	// The legend, from the first panel's series.
	if len(panels) > 0 {
		x := plotLeft
		for _, s := range panels[0].series {
			fill(img, image.Rect(x, 24, x+18, 28), s.color)
			text(img, x+22, 30, s.name, plotInk)
			x += 22 + 7*len(s.name) + 24
		}
	}
	var xMax float64
	for _, p := range panels {
		for _, s := range p.series {
			for _, x := range s.xs {
				xMax = max(xMax, x)
			}
		}
	}
	xMax = niceMax(xMax)
	right := plotWidth - plotRight
	for i, p := range panels {
		top := plotTop + i*(panelHeight+panelGap) + panelGap
		bottom := top + panelHeight
		text(img, plotLeft, top-8, p.title, plotInk)
		var yMax float64
		for _, s := range p.series {
			for _, y := range s.ys {
				yMax = max(yMax, y)
			}
		}
		yMax = niceMax(yMax)
		for k := 0; k <= 4; k++ {
			y := bottom - k*panelHeight/4
			hline(img, plotLeft, right, y, plotGrid)
			label := number(yMax * float64(k) / 4)
			text(img, plotLeft-8-7*len(label), y+4, label, plotInk)
		}
		for k := 0; k <= 10; k++ {
			x := plotLeft + k*(right-plotLeft)/10
			vline(img, x, top, bottom, plotGrid)
			if i == len(panels)-1 {
				label := number(xMax * float64(k) / 10)
				text(img, x-7*len(label)/2, bottom+16, label, plotInk)
			}
		}
		hline(img, plotLeft, right, bottom, plotInk)
		vline(img, plotLeft, top, bottom, plotInk)
		px := func(x float64) int { return plotLeft + int(math.Round(x/xMax*float64(right-plotLeft))) }
		py := func(y float64) int { return bottom - int(math.Round(y/yMax*float64(panelHeight))) }
		for _, s := range p.series {
			for j := 1; j < len(s.xs); j++ {
				line(img, px(s.xs[j-1]), py(s.ys[j-1]), px(s.xs[j]), py(s.ys[j]), s.color)
			}
			if len(s.xs) == 1 {
				fill(img, image.Rect(px(s.xs[0])-2, py(s.ys[0])-2, px(s.xs[0])+2, py(s.ys[0])+2), s.color)
			}
		}
	}
	text(img, (plotWidth-7*len(xLabel))/2, h-8, xLabel, plotInk)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// niceMax rounds v up to 1, 2, 2.5 or 5 times a power of ten (1 for 0).
func niceMax(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// number formats an axis value: four significant digits at most, k and M for tens of
// thousands and millions.
func number(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case v >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	default:
		return strconv.FormatFloat(v, 'g', 4, 64)
	}
}

func text(img *image.RGBA, x, y int, s string, c color.RGBA) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	draw.Draw(img, r, image.NewUniform(c), image.Point{}, draw.Src)
}

func hline(img *image.RGBA, x0, x1, y int, c color.RGBA) {
	for x := x0; x <= x1; x++ {
		img.SetRGBA(x, y, c)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, c color.RGBA) {
	for y := y0; y <= y1; y++ {
		img.SetRGBA(x, y, c)
	}
}

// line draws a line two pixels high (Bresenham's, each point doubled below).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	for e := dx + dy; ; {
		img.SetRGBA(x0, y0, c)
		img.SetRGBA(x0, y0+1, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}
