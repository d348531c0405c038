package main

import (
	"fmt"
	"image/color"
	"os"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// plotCDF draws the empirical distribution of each series (the fraction of
// samples at or below x milliseconds) into a PNG, with the legend in a
// column of its own to the right. With logX, x is on a log scale (samples
// must then be positive; smaller ones are drawn at 0.01 ms).
func plotCDF(path, title string, ss []*series, logX bool) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "milliseconds"
	p.Y.Label.Text = "fraction of samples ≤ x"
	if logX {
		p.X.Label.Text = "milliseconds (log scale)"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	p.Y.Min, p.Y.Max = 0, 1
	p.Add(plotter.NewGrid())
	legend := plot.NewLegend()
	legend.TextStyle.Color = color.Black
	legend.Top, legend.Left = true, true
	legend.TextStyle.Font.Size = vg.Points(9)
	hi := 0.0
	for i, s := range ss {
		if len(s.ms) == 0 {
			continue
		}
		v := slices.Clone(s.ms)
		slices.Sort(v)
		hi = max(hi, v[len(v)-1])
		var steps, points plotter.XYs
		for j, x := range v {
			if logX {
				x = max(x, 0.01)
			}
			if j > 0 {
				steps = append(steps, plotter.XY{X: x, Y: float64(j) / float64(len(v))})
			}
			steps = append(steps, plotter.XY{X: x, Y: float64(j+1) / float64(len(v))})
			points = append(points, plotter.XY{X: x, Y: float64(j+1) / float64(len(v))})
		}
		l, err := plotter.NewLine(steps)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.6)
		p.Add(l)
		sum := summarize(s.ms)
		label := fmt.Sprintf("%s: n=%d, p50 %s, p99 %s ms", s.system, sum.n, ms(sum.p50), ms(sum.p99))
		if len(v) < 30 {
			// Few samples (leader election at its defaults): mark each.
			sc, err := plotter.NewScatter(points)
			if err != nil {
				return err
			}
			sc.Color = plotutil.Color(i)
			sc.Shape = draw.CircleGlyph{}
			sc.Radius = vg.Points(3)
			p.Add(sc)
			legend.Add(label, l, sc)
		} else {
			legend.Add(label, l)
		}
	}

	if logX {
		p.X.Max = hi * 1.5 // room for the largest sample's marker
	}
	const w, h, legendW = 13 * vg.Inch, 5.5 * vg.Inch, 4.2 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	p.Draw(draw.Crop(dc, 0, -legendW, 0, 0))
	legend.Draw(draw.Crop(dc, w-legendW+vg.Points(8), 0, 0, -vg.Points(30)))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
