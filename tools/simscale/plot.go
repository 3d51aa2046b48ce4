package simscale

import (
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"strconv"
)

// Series is one line of a plot: seconds against trainers.
type Series struct {
	Color  color.RGBA
	Points [][2]float64 // trainers, seconds
}

// Plot colours, named in the legend docs/scale.md gives.
var (
	Blue   = color.RGBA{31, 119, 180, 255}
	Orange = color.RGBA{255, 127, 14, 255}
	Green  = color.RGBA{44, 160, 44, 255}
	Grey   = color.RGBA{127, 127, 127, 255}
)

// Plot writes a PNG of the series: trainers on a log₂ axis, seconds on a
// log₁₀ axis, each axis labelled with its tick values (the standard
// library has no fonts: digits are drawn from a 3×5 bitmap).
func Plot(path string, series []Series) error {
	const w, h, left, right, top, bottom = 720, 450, 60, 20, 20, 40
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for i := range img.Pix {
		img.Pix[i] = 255
	}
	minX, maxX, minY, maxY := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for _, p := range s.Points {
			minX, maxX = min(minX, p[0]), max(maxX, p[0])
			minY, maxY = min(minY, math.Max(p[1], 1e-3)), max(maxY, p[1])
		}
	}
	if minX >= maxX || minY >= maxY {
		maxX, maxY = minX*2, minY*10
	}
	ly0, ly1 := math.Floor(math.Log10(minY)), math.Ceil(math.Log10(maxY))
	lx0, lx1 := math.Log2(minX), math.Log2(maxX)
	px := func(x float64) int { return left + int((math.Log2(x)-lx0)/(lx1-lx0)*float64(w-left-right)) }
	py := func(y float64) int {
		return h - bottom - int((math.Log10(math.Max(y, 1e-3))-ly0)/(ly1-ly0)*float64(h-top-bottom))
	}
	axis := color.RGBA{0, 0, 0, 255}
	light := color.RGBA{225, 225, 225, 255}
	for e := ly0; e <= ly1; e++ {
		y := py(math.Pow(10, e))
		line(img, left, y, w-right, y, light)
		text(img, 4, y-2, strconv.FormatFloat(math.Pow(10, e), 'g', -1, 64), axis)
	}
	for _, p := range series[0].Points {
		x := px(p[0])
		line(img, x, top, x, h-bottom, light)
		text(img, x-4, h-bottom+8, strconv.Itoa(int(p[0])), axis)
	}
	line(img, left, top, left, h-bottom, axis)
	line(img, left, h-bottom, w-right, h-bottom, axis)
	for _, s := range series {
		for i, p := range s.Points {
			x, y := px(p[0]), py(p[1])
			for dx := -3; dx <= 3; dx++ {
				for dy := -3; dy <= 3; dy++ {
					img.Set(x+dx, y+dy, s.Color)
				}
			}
			if i > 0 {
				q := s.Points[i-1]
				for d := -1; d <= 1; d++ {
					line(img, px(q[0]), py(q[1])+d, x, y+d, s.Color)
				}
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// line draws a line from (x0, y0) to (x1, y1) (Bresenham).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	e := dx + dy
	for {
		img.Set(x0, y0, c)
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

// glyphs are 3×5 bitmaps of the characters tick labels use, row by row,
// the top bit of each row's three the leftmost pixel.
var glyphs = map[rune][5]uint8{
	'0': {7, 5, 5, 5, 7}, '1': {2, 6, 2, 2, 7}, '2': {7, 1, 7, 4, 7}, '3': {7, 1, 7, 1, 7}, '4': {5, 5, 7, 1, 1},
	'5': {7, 4, 7, 1, 7}, '6': {7, 4, 7, 5, 7}, '7': {7, 1, 1, 1, 1}, '8': {7, 5, 7, 5, 7}, '9': {7, 5, 7, 1, 7},
	'.': {0, 0, 0, 0, 2}, '-': {0, 0, 7, 0, 0}, 'e': {0, 7, 7, 4, 7},
}

// text draws s at (x, y) in glyphs scaled ×2.
func text(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, r := range s {
		g := glyphs[r]
		for row := 0; row < 5; row++ {
			for col := 0; col < 3; col++ {
				if g[row]&(4>>col) != 0 {
					for d := 0; d < 4; d++ {
						img.Set(x+2*col+d%2, y+2*row+d/2, c)
					}
				}
			}
		}
		x += 8
	}
}
